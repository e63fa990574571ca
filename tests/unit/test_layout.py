"""The layout's rules, checked on the source tree with `ast` (no imports executed).

- Every package folder (a folder with `__init__.py` under a mapped folder) is listed in
  pyproject.toml, and every listed package has its folder: none can be forgotten.
- Who may import whom is the table "Who may import whom" of docs/architecture.md: the
  test reads it, so the document cannot drift from the code. A module belongs to the most
  specific package of the table that contains it; it may import its own package and the
  packages its row names (function-level imports included).
- No import cycle between modules, and none between the table's packages.
- Table names are spelled in one module only (the catalogue), outside docstrings.
- `collector/` is the ingest service only and stays small; top-level module counts too.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS = {name: REPO / folder for name, folder in SETUPTOOLS["package-dir"].items()}
CATALOGUE = "kvscope.collector.storage.tables"
TABLE_NAME = re.compile(
    r"\b(kv_block_events|engine_stats|kv_transfers|engine_histograms|stream_gaps|"
    r"ingest_errors|ingest_batches|ingest_inserts|kv_transfer_latency_1m|kv_block_events_1m|kvscope_migrations)\b"
)
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _package_folders() -> dict[str, Path]:
    """Every import package -> its folder, found on disk under the mapped folders."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            found[".".join((package, *relative))] = init.parent
    return found


PACKAGES = _package_folders()


def _modules() -> dict[str, Path]:
    """Every kvscope module name -> its file."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """kvscope modules `name` imports explicitly (anywhere in the file)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        yield from (t for t in targets if t in MODULES and t != name)


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _allowed_table() -> dict[str, set[str]]:
    """docs/architecture.md's "Who may import whom": package -> packages it may import."""
    text = ARCHITECTURE.read_text()
    section = text.split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        package = "kvscope." + cells[0].strip("`")
        table[package] = {"kvscope." + n for n in re.findall(r"`([a-z_.]+)`", cells[1])}
    return table


ALLOWED = _allowed_table()


def _unit(module: str) -> str | None:
    """The most specific package of the table that holds `module`."""
    owners = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return max(owners, key=len) if owners else None


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, if there is any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(SETUPTOOLS["packages"])
    assert set(PACKAGES) - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - set(PACKAGES) == set(), "listed packages without a folder"


def test_the_module_map_is_complete() -> None:
    assert {
        "kvscope.publisher.kafka",
        "kvscope.publisher.vllm.plugin",
        "kvscope.collector.pipeline.service",
        "kvscope.cli.main",
        "kvscope.cli.commands.collect",
        "kvscope.analytics.report.gather",
        CATALOGUE,
    } <= set(MODULES)
    assert GRAPH["kvscope.cli.main"], "the import scan found no imports at all"


def test_the_table_covers_every_package() -> None:
    assert len(ALLOWED) >= 15, "the table of docs/architecture.md was not found"
    assert {p for p in PACKAGES if _unit(p) is None} == set()
    named = set().union(*ALLOWED.values())
    assert named - set(ALLOWED) == set(), "the table names packages it has no row for"


def test_no_import_cycle_between_modules() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_no_import_cycle_between_packages() -> None:
    packages: dict[str, set[str]] = {}
    for name, deps in GRAPH.items():
        unit = _unit(name)
        assert unit is not None
        packages.setdefault(unit, set()).update(
            u for d in deps if (u := _unit(d)) is not None and u != unit
        )
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_table(package: str) -> None:
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        if _unit(name) == package
        for dep in deps
        if _unit(dep) != package and _unit(dep) not in ALLOWED[package]
    )
    assert wrong == [], f"not allowed by docs/architecture.md: {wrong}"


def test_the_engine_side_imports_nothing_of_the_service_side() -> None:
    engine_side = {"kvscope.schemas", "kvscope.common", "kvscope.publisher"}
    for package, allowed in ALLOWED.items():
        if any(package == p or package.startswith(p + ".") for p in engine_side):
            reach = {a for a in allowed if not any(a.startswith(p) for p in engine_side)}
            assert reach == set(), f"{package} may import {reach}"


def _code_strings(path: Path) -> Iterator[tuple[int, str]]:
    """String constants of a file, except docstrings (string expression statements)."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.lineno, node.value


def test_table_names_live_in_the_catalogue_only() -> None:
    files = [p for n, p in MODULES.items() if n != CATALOGUE]
    files += sorted((REPO / "bench").glob("*.py"))
    found = [
        f"{path.relative_to(REPO)}:{line}: {TABLE_NAME.search(text).group(0)}"
        for path in files
        for line, text in _code_strings(path)
        if TABLE_NAME.search(text)
    ]
    assert found == []
    spelled = {
        match.group(0)
        for _, text in _code_strings(MODULES[CATALOGUE])
        for match in TABLE_NAME.finditer(text)
    }
    assert len(spelled) == 11, spelled


@pytest.mark.parametrize(("folder", "most"), [("publisher", 10), ("collector", 3)])
def test_top_level_stays_small(folder: str, most: int) -> None:
    assert len(list((REPO / folder).glob("*.py"))) <= most


def test_the_collector_is_the_ingest_service_only() -> None:
    folders = {p.name for p in (REPO / "collector").iterdir() if (p / "__init__.py").exists()}
    assert folders == {"pipeline", "storage"}
    lines = sum(len(p.read_text().splitlines()) for p in (REPO / "collector").rglob("*.py"))
    assert lines <= 5_000

"""The layout's rules, checked on the source tree with `ast` (no imports executed).

- No import cycle between kvscope modules (function-level imports included).
- Dependency direction: schemas imports nothing of ours; the engine side (publisher and
  its sub-packages) only schemas; the consumer only schemas.
- Table names are spelled in one module only (the catalogue), outside docstrings.
- Top-level module counts of publisher/ and collector/ stay small.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {
    name: REPO / folder
    for name, folder in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
}
CATALOGUE = "kvscope.collector.storage.tables"
TABLE_NAME = re.compile(
    r"\b(kv_block_events|engine_stats|kv_transfers|engine_histograms|stream_gaps|"
    r"ingest_errors|ingest_batches|ingest_inserts|kv_transfer_latency_1m|kv_block_events_1m|kvscope_migrations)\b"
)


def _modules() -> dict[str, Path]:
    """Every kvscope module name -> its file, from pyproject's package map."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
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


def _cycle() -> list[str] | None:
    """One import cycle, if there is any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_module_map_is_complete() -> None:
    assert {"kvscope.publisher.kafka", "kvscope.cli.main", CATALOGUE} <= set(MODULES)
    assert GRAPH["kvscope.cli.main"], "the import scan found no imports at all"


def test_no_import_cycle() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("kvscope.schemas", ("kvscope.schemas",)),
        ("kvscope.publisher", ("kvscope.schemas", "kvscope.publisher")),
        ("kvscope.consumer", ("kvscope.schemas", "kvscope.consumer")),
    ],
)
def test_dependency_direction(package: str, allowed: tuple[str, ...]) -> None:
    wrong = {
        (name, dep)
        for name, deps in GRAPH.items()
        if name == package or name.startswith(package + ".")
        for dep in deps
        if not any(dep == a or dep.startswith(a + ".") for a in allowed)
    }
    assert wrong == set()


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


@pytest.mark.parametrize(("folder", "most"), [("publisher", 10), ("collector", 6)])
def test_top_level_stays_small(folder: str, most: int) -> None:
    assert len(list((REPO / folder).glob("*.py"))) <= most

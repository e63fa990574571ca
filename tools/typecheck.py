"""Type-check every kvscope package with mypy; CI's lint step runs this after ruff.

pyproject.toml maps each import package kvscope.X to a top-level folder
(`[tool.setuptools.package-dir]`), and `kvscope` itself has no folder. The editable install
finds the packages through setuptools' import hook, which mypy cannot follow
(`mypy -p kvscope.schemas`: "Can't find package"). So this script builds the tree mypy
expects, .mypy_cache/kvscope-tree/kvscope/X as links to the folders, runs mypy with MYPYPATH
on it and prints mypy's report with the folders' own paths. Settings: pyproject's [tool.mypy].

    python tools/typecheck.py [more mypy arguments]

Exit status: mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
TREE = REPO / ".mypy_cache" / "kvscope-tree"
NAMESPACE = "kvscope"


def package_dirs() -> dict[str, Path]:
    """Import package -> its folder, from pyproject's package-dir (sub-packages need none)."""
    setuptools = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    found: dict[str, Path] = {}
    for name, folder in setuptools["package-dir"].items():
        parent, _, leaf = name.partition(".")
        # One level below the namespace only: a deeper key would put a link inside a linked
        # folder, that is, into the source tree.
        if parent != NAMESPACE or not leaf or "." in leaf:
            sys.exit(f"typecheck: cannot map package-dir entry {name!r}, expected {NAMESPACE}.X")
        found[name] = REPO / folder
    return found


def build_tree(packages: dict[str, Path]) -> Path:
    """TREE/kvscope/X -> the folder of kvscope.X, for every package; returns TREE/kvscope."""
    root = TREE / NAMESPACE
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():  # links of a previous run; a package may have gone
        if not entry.is_symlink():
            sys.exit(f"typecheck: {entry} is not a link; remove {TREE} by hand")
        entry.unlink()
    for name, folder in packages.items():
        if not (folder / "__init__.py").is_file():
            sys.exit(f"typecheck: {name}: {folder} has no __init__.py")
        link = root / name.partition(".")[2]
        link.symlink_to(os.path.relpath(folder, root), target_is_directory=True)
    return root


def main(argv: list[str]) -> int:
    packages = package_dirs()
    root = build_tree(packages)
    search = [str(TREE), *filter(None, [os.environ.get("MYPYPATH")])]
    command = [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT)]
    for name in packages:
        command += ["-p", name]
    done = subprocess.run(
        [*command, *argv],
        cwd=REPO,
        env={**os.environ, "MYPYPATH": os.pathsep.join(search)},
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    # mypy names files by the links it read them through; name the folders instead.
    report = done.stdout
    for name, folder in packages.items():
        link = root / name.partition(".")[2]
        for seen in (link.relative_to(REPO), link):
            report = report.replace(f"{seen}{os.sep}", f"{folder.relative_to(REPO)}{os.sep}")
    sys.stdout.write(report)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

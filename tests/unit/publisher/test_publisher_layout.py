"""The publisher's layout rules: the sender does not reach back into kafka.py; a small top level."""

from __future__ import annotations

import ast
from pathlib import Path

import kvscope.publisher

PACKAGE = Path(kvscope.publisher.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_sender_and_queue_do_not_import_the_kafka_module() -> None:
    for name in ("sender.py", "queue.py", "backoff.py"):
        imported = _imported_modules(PACKAGE / name)
        assert "kvscope.publisher.kafka" not in imported, name
        assert "kvscope.publisher" not in imported, name


def test_the_top_level_keeps_at_most_ten_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert "__init__.py" in modules
    assert len(modules) <= 10, modules

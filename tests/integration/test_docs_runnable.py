"""The shell blocks of README.md and docs/ marked runnable run as written.

A block is marked by a line `<!-- runnable -->` right before its opening fence. Each runs
with `bash -euo pipefail` in a fresh directory, `kvscope` on PATH (the one installed in
the running Python's environment), against the local stack it starts itself. Keep marked
blocks small: every one costs CI seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"^<!-- runnable -->\n```(?:bash|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    """(where, script) of every marked block of README.md and docs/*.md."""
    blocks = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for k, match in enumerate(MARKED.finditer(text)):
            blocks.append((f"{path.relative_to(REPO)}#{k}", match[1]))
    return blocks


def test_some_block_is_marked() -> None:
    assert runnable_blocks(), "no block is marked <!-- runnable -->"


@pytest.mark.parametrize(
    ("where", "script"), runnable_blocks(), ids=[w for w, _ in runnable_blocks()]
)
def test_marked_block_runs(where: str, script: str, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("KVSCOPE_CLICKHOUSE_URL", None)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{where} failed:\n{script}\n{result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr

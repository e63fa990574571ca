"""`pytest -m "not vllm"` runs without vLLM: every test that needs it carries the mark.

The schema tests decode real vLLM captures; those that also import the installed vLLM
must be marked `vllm`, so a machine without vLLM can run the rest. Checked by running
them in a child pytest with `vllm` shadowed by a package whose import fails. The child
runs 5% of the property tests' examples: every code path they reach still runs without
vLLM, and all 10,000 cases run in the session itself (20 s less).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_not_vllm_selection_passes_without_vllm(tmp_path: Path) -> None:
    shadow = tmp_path / "vllm"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("vllm is hidden by this test")\n')
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)]),
        "KVSCOPE_TEST_EXAMPLES_SCALE": "0.05",
    }
    pytest_args = [
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not vllm",
        str(TESTS / "unit" / "schemas"),
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        capture_output=True,
        text=True,
        env=env,
        cwd=TESTS.parent,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "deselected" in result.stdout.splitlines()[-1], result.stdout[-500:]

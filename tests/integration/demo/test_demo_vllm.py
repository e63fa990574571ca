"""`kvscope demo --engine vllm`: two real vLLM engines (the tiny test model) instead of the
simulator, through kvscope's vLLM plugin, the broker and the collector into the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.vllm
def test_demo_with_real_vllm_engines(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope.cli",
            "demo",
            "--engine",
            "vllm",
            "--model-path",
            str(tiny_llama),
            "--scale",
            "small",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((out / "report.json").read_text())
    fleet = report["fleet"]
    assert [i["instance"] for i in fleet["instances"]] == ["vllm-0", "vllm-1"]
    assert fleet["roles"] == {"both": 2}
    assert fleet["records"]["requests"] == 2 * 16  # every prompt each engine finished
    assert fleet["records"]["kv_block_events"] > 0
    assert 0 < fleet["hit_rate"] < 1  # shared system prompts hit, questions miss
    assert fleet["completeness"]["share"] == 1.0
    assert any(f["churn_ratio"] for f in report["instances"])  # the small cache evicts
    assert report["transfers"]["pairs"] == []  # no prefill/decode split
    assert (out / "report.html").stat().st_size > 0

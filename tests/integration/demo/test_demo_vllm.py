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


@pytest.mark.vllm
def test_an_engine_slower_than_the_start_timeout_is_one_line_naming_the_flag(
    tmp_path: Path,
) -> None:
    """It ended in "a vLLM engine did not start:" with nothing after the colon, and the 180 s
    could not be raised. A folder with an empty config.json passes the demo's check; the
    engine cannot be ready within 0.5 s (importing vLLM alone takes longer)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "kvscope.cli", "demo", "--engine", "vllm"),
            *("--model-path", str(model), "--engine-start-timeout", "0.5"),
            *("--scale", "small", "--out", str(tmp_path / "demo")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in result.stderr.splitlines() if "kvscope demo: error" in line]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1, result.stderr
    assert "did not start within 0.5 s" in lines[0]
    assert "--engine-start-timeout" in lines[0]
    assert lines[0].rstrip()[-1] != ":", lines[0]

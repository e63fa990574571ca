"""`kvscope demo --engine vllm-pd`: a real prefill→decode vLLM pair over NIXL instead of the
simulator, so the report's transfer section comes from real hand-offs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import clickhouse_connect
import pytest
from kvscope.local.demo import DATABASE, PD_REQUESTS
from kvscope.local.pd_pair import BLOCK_SIZE


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_demo_with_a_real_prefill_decode_pair(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "kvscope.cli", "demo", "--engine", "vllm-pd"]
    command += ["--model-path", str(tiny_llama), "--scale", "small", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1700, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    client = clickhouse_connect.get_client(dsn=f"chdb://{out / 'chdb'}", database=DATABASE)
    rows = client.query(
        "SELECT request_id, src_instance, dst_instance, blocks, bytes, status FROM kv_transfers"
    ).result_rows
    client.close()
    assert len(rows) == PD_REQUESTS["small"]  # one per hand-off the proxy asked for
    assert len({r[0] for r in rows}) == len(rows) and all(
        r[0].startswith("cmpl-demo-") for r in rows
    )
    assert {(r[1], r[2]) for r in rows} == {("prefill-0", "decode-0")}
    ok = [r for r in rows if r[5] == "ok"]
    per_block = {r[4] // r[3] for r in ok}
    assert len(per_block) == 1 and all(r[3] > 0 for r in ok)
    config = json.loads((tiny_llama / "config.json").read_text())
    assert per_block == {
        2
        * config["num_hidden_layers"]
        * config["num_key_value_heads"]
        * config["head_dim"]
        * 4
        * BLOCK_SIZE
    }

    report = json.loads((out / "report.json").read_text())
    [pair] = report["transfers"]["pairs"]
    assert (pair["src"], pair["dst"]) == ("prefill-0", "decode-0")
    assert pair["transfers"] == len(rows)  # the report counts failed transfers too
    assert ok
    assert 0 < pair["p50_ms"] <= pair["max_ms"]
    assert report["fleet"]["roles"] == {"decode": 1, "prefill": 1}

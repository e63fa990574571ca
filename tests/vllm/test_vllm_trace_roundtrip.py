"""Round trip on a real engine: a vLLM engine replays a generated Mooncake-format trace
with kvscope on; `kvscope trace export` writes its stored access stream as a trace, and
`kvscope simulate --workload trace` replays that at the same capacity: the simulator's hit
rate is within 1 point of the one vLLM reported (its own num_cached_tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvscope.cli.main import main
from support.e2e_support import collect
from support.vllm_e2e import plugin_env, run_trace_engine, trace_truth, zipf_trace

BLOCKS = 32


@pytest.mark.vllm
def test_exported_trace_replays_to_the_engines_hit_rate(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = zipf_trace(tmp_path / "generated.jsonl", requests=60, rate=2.0)
    env = plugin_env(bootstrap_servers, topic_prefix, "engine-0")
    truth = trace_truth(run_trace_engine(tiny_llama, trace, tmp_path, env, BLOCKS))
    assert len(truth["requests"]) == 60
    assert 0.05 < truth["hit_rate"] < 0.95
    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)

    exported = tmp_path / "exported.jsonl"
    capsys.readouterr()
    assert main(["trace", "export", "--clickhouse", clickhouse_url, "--out", str(exported)]) == 0
    assert "32 tokens each" in capsys.readouterr().err
    lines = [json.loads(x) for x in exported.read_text().splitlines()]
    generated = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [(x["input_length"], x["output_length"]) for x in lines] == [
        (x["input_length"], x["output_length"]) for x in generated
    ], "same requests, same order"
    full_ids = [x["hash_ids"][: x["input_length"] // 32] for x in generated]
    assert [len(x["hash_ids"]) for x in lines] == [len(ids) for ids in full_ids]

    replayed = tmp_path / "replayed.json"
    code = main(
        [
            "simulate", "--dry-run", "--workload", "trace", "--trace", str(exported),
            "--requests", str(len(lines)), "--instances", "1",
            "--trace-block-tokens", "32", "--block-size", "32",
            "--capacity-blocks", str(BLOCKS), "--truth", str(replayed),
        ]
    )  # fmt: skip
    assert code == 0
    simulated = json.loads(replayed.read_text())["fleet"]["hit_rate"]
    print(f"round trip: vLLM {truth['hit_rate']:.4f}, simulated from the export {simulated:.4f}")
    assert simulated == pytest.approx(truth["hit_rate"], abs=0.01)

"""`kvscope trace export` round trip: a simulated fleet's stored access stream, exported as
a Mooncake-format trace and replayed by `kvscope simulate --workload trace` with the same
capacity, block size and routing, gives the same hit rate; and no engine hash leaves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvscope.cli.main import main
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import simulate_direct

START = 1767225600.0


@pytest.mark.parametrize(
    ("workload", "instances", "block_size", "capacity"),
    [
        ("generated-shared-prefix", "1", 16, 300),
        ("generated-shared-prefix", "2", 32, 120),
        ("multi-turn", "1", 16, 400),
        ("zipf", "3", 64, 60),
    ],
)
def test_export_then_replay_gives_the_same_hit_rate(
    tables: Any,
    clickhouse_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    workload: str,
    instances: str,
    block_size: int,
    capacity: int,
) -> None:
    config = SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        requests=300,
        block_size=block_size,
        capacity_blocks=capacity,
        start_ts=START,
        seed=5,
    )
    truth, _ = simulate_direct(tables, config)
    out = tmp_path / "trace.jsonl"
    capsys.readouterr()
    assert main(["trace", "export", "--clickhouse", clickhouse_url, "--out", str(out)]) == 0
    said = capsys.readouterr().err
    assert f"{block_size} tokens each" in said and f"--block-size {block_size}" in said

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == config.requests
    assert lines[0]["timestamp"] == 0
    assert [x["timestamp"] for x in lines] == sorted(x["timestamp"] for x in lines)
    ids = sorted({i for x in lines for i in x["hash_ids"]})
    assert ids == list(range(len(ids))), "hash ids are dense, numbered from 0"
    stored = {
        h for (h,) in tables.query("SELECT DISTINCT block_hash FROM kv_block_events").result_rows
    }
    assert not stored & set(ids[2:]), "no engine hash leaves (ids are small integers)"
    for x in lines:
        assert len(x["hash_ids"]) == x["input_length"] // block_size

    replayed = tmp_path / "replayed.json"
    code = main(
        [
            "simulate", "--dry-run", "--workload", "trace", "--trace", str(out),
            "--requests", str(len(lines)), "--instances", instances,
            "--trace-block-tokens", str(block_size), "--block-size", str(block_size),
            "--capacity-blocks", str(capacity), "--start-time", str(START),
            "--truth", str(replayed),
        ]
    )  # fmt: skip
    assert code == 0
    again = json.loads(replayed.read_text())["fleet"]
    assert again["hit_rate"] == pytest.approx(truth["fleet"]["hit_rate"], abs=0.01)
    assert 0 < truth["fleet"]["hit_rate"] < 1


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], "no accesses in this window"),
        (["--since", "2h", "--until", "3h"], "must be before"),
        (["--until", "yesterday-ish"], "until"),
    ],
)
def test_export_refuses_with_one_line(
    tables: Any,
    clickhouse_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    said: str,
) -> None:
    out = tmp_path / "trace.jsonl"
    code = main(["trace", "export", "--clickhouse", clickhouse_url, "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code != 0  # 1 today; bad input becomes 2 with the CLI's exit-code fix
    assert said in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_export_refuses_a_directory_and_mixed_block_sizes(
    tables: Any, clickhouse_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for block_size, instances in ((16, "1"), (32, "1")):
        config = SimConfig(
            instances=parse_instances(instances),
            requests=20,
            block_size=block_size,
            model=f"m{block_size}",
            start_ts=START,
        )
        simulate_direct(tables, config)
    base = ["trace", "export", "--clickhouse", clickhouse_url]
    assert main([*base, "--out", str(tmp_path)]) != 0
    assert "is a directory" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "t.jsonl")]) != 0
    assert "mixes block sizes 16, 32" in capsys.readouterr().err
    assert main([*base, "--model", "m32", "--out", str(tmp_path / "t.jsonl")]) == 0
    assert "32 tokens each" in capsys.readouterr().err


@pytest.mark.parametrize(("instances", "output_len"), [("1p,1d", 32), ("2p,1d", 7)])
def test_a_pd_fleets_trace_has_the_decode_sides_output_length(
    tables: Any, clickhouse_url: str, tmp_path: Path, instances: str, output_len: int
) -> None:
    """It wrote `output_length: 1` for every request: the prefill side's count."""
    config = SimConfig(
        instances=parse_instances(instances),
        requests=40,
        capacity_blocks=200,
        start_ts=START,
        seed=2,
        workload_params={"output_len": output_len},
    )
    simulate_direct(tables, config)
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "export", "--clickhouse", clickhouse_url, "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == config.requests
    assert {x["output_length"] for x in lines} == {output_len}

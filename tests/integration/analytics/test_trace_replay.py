"""Trace replay (`--workload trace`): generated Mooncake-format traces through the analytics.

The traces come from the simulator's own workloads (`write_trace`): shared system prompts
across requests and multi-turn chats whose every turn re-sends the growing history. The
replayed run's truth must equal the analytics like any other workload, and the capacity
what-if (access replay) must hold on it as well.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from kvscope.cli.main import main
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from kvscope.simulator.trace import write_trace
from kvscope.simulator.workloads import generate
from support.analytics_kit import FAR_FUTURE, assert_matches_truth, query, simulate_direct


def _trace(path: Path) -> Path:
    """Shared-prefix groups and long multi-turn chats, interleaved by arrival time."""
    shared = generate(
        "generated-shared-prefix", 150, 3, 6.0, {"groups": 5, "system_prompt_len": 1200}
    )
    chats = generate("multi-turn", 150, 3, 6.0, {"turns": 6, "user_len": 200, "output_len": 150})
    write_trace(path, sorted(shared + chats, key=lambda r: r.arrival_s))
    return path


@pytest.mark.parametrize(
    ("instances", "routing", "block_size", "capacity"),
    [("2", "prefix-aware", 512, 24), ("1p,2d", "round-robin", 16, 500)],
)
def test_trace_replay_matches_truth_and_what_if(
    tables: Any, tmp_path: Path, instances: str, routing: str, block_size: int, capacity: int
) -> None:
    config = SimConfig(
        instances=parse_instances(instances),
        workload="trace",
        trace=str(_trace(tmp_path / "trace.jsonl")),
        time_scale=0.5,
        requests=300,
        routing=routing,
        block_size=block_size,
        capacity_blocks=capacity,
        model=f"trace-{block_size}",
    )
    truth, samples = simulate_direct(tables, config)
    assert truth["fleet"]["requests_finished"] == 300 * (
        2 if "p" in instances else 1
    )  # P/D: both sides
    assert sum(s["refaults"] for s in truth["sources"].values()) > 0
    assert_matches_truth(tables, truth, samples)
    rows = query(tables, "capacity_what_if", model=config.model, fractions=[0.25, 0.5, 1.0])
    for row in (r for r in rows if r["instance"] == "*"):
        bigger = dataclasses.replace(
            config, capacity_blocks=capacity + int(capacity * row["fraction"]), access_stream=False
        )
        real = Fleet(bigger).run()["fleet"]["hit_rate"]
        error_pp = 100 * (row["predicted_hit_rate"] - real)
        assert row["method"].startswith("access-replay")
        assert abs(error_pp) <= 2.0, (row["fraction"], error_pp)


def test_simulate_cli_replays_a_trace(tmp_path: Path, clickhouse_url: str, capsys: Any) -> None:
    trace = _trace(tmp_path / "trace.jsonl")
    truth_file = tmp_path / "truth.json"
    args = [
        "simulate",
        "--clickhouse",
        clickhouse_url,
        "--workload",
        "trace",
        "--trace",
        str(trace),
    ]
    args += ["--requests", "120", "--block-size", "512", "--capacity-blocks", "40"]
    assert main([*args, "--time-scale", "0.25", "--truth", str(truth_file)]) == 0
    truth = json.loads(truth_file.read_text())
    assert truth["config"]["trace"] == str(trace)
    capsys.readouterr()
    hit = ["query", "hit_rate", "--clickhouse", clickhouse_url, "--param", f"until={FAR_FUTURE}"]
    assert main([*hit, "--format", "json"]) == 0
    fleet = next(r for r in json.loads(capsys.readouterr().out) if r["instance"] == "*")
    assert abs(fleet["hit_rate"] - truth["fleet"]["hit_rate"]) < 1e-9
    assert main(["simulate", "--dry-run", "--workload", "trace"]) == 2  # bad input: exit 2
    assert "--trace FILE" in capsys.readouterr().err


def test_a_trace_longer_than_since_1970_cannot_end_now(
    tmp_path: Path, clickhouse_url: str, capsys: Any
) -> None:
    """Without --start-time a published run ends now: one spanning 2e9 s would start before
    1970 (it said '--start-time -2.0439e+08: give epoch seconds from 0 ...', of an option
    the user never gave)."""
    trace = tmp_path / "long.jsonl"
    lines = [{"timestamp": t, "input_length": 10, "output_length": 1} for t in (0, 2e12)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["simulate", "--clickhouse", clickhouse_url, "--workload", "trace", "--trace"]
    assert main([*args, str(trace)]) == 2
    assert "spans 2e+09 simulated seconds" in capsys.readouterr().err

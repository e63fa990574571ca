"""A reported capacity of 0 (a vLLM engine's last EngineStats before the fix) is never taken.

Hand-made `engine_stats` rows: each source reports 0 in the window (what a run shorter than
the stats interval sent) and, before it or in it, its real capacity or nothing.
`capacity_what_if` and `report_instances` must use the real capacity where one was ever
reported, and 0 only where none was.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.analytics_kit import hand_made_ts, query

STATS_DEFAULTS: dict[str, Any] = {
    "dp_rank": 0, "model": "m", "role": "both", "engine": "vllm", "epoch": 1, "block_size": 16,
    "usage": 0.5, "running": 0, "waiting": 0, "prefix_queries": 100, "prefix_hits": 10,
    "preemptions": 0, "interval_s": 1.0, "_topic": "t", "_partition": 0,
}  # fmt: skip


def insert_stats(client: Any, rows: list[dict[str, Any]]) -> None:
    """Hand-made `engine_stats` rows (instance, ts, capacity_blocks, seq, _offset set)."""
    columns = [*STATS_DEFAULTS, "instance", "ts", "capacity_blocks", "seq", "_offset"]
    data = [[{**STATS_DEFAULTS, **r}[c] for c in columns] for r in rows]
    client.insert("engine_stats", data, column_names=columns)


@pytest.mark.parametrize("capacity", [1, 12, 4096, 2**40])
def test_zero_capacity_in_the_window_takes_the_real_one(tables: Any, capacity: int) -> None:
    rows = [
        # "before": real capacity reported before the window only
        {"instance": "before", "ts": hand_made_ts(1), "capacity_blocks": capacity},
        {"instance": "before", "ts": hand_made_ts(20), "capacity_blocks": 0},
        # "inside": real capacity and a 0 both in the window
        {"instance": "inside", "ts": hand_made_ts(15), "capacity_blocks": 2 * capacity},
        {"instance": "inside", "ts": hand_made_ts(21), "capacity_blocks": 0},
        # "never": only ever reported 0
        {"instance": "never", "ts": hand_made_ts(22), "capacity_blocks": 0},
        # "later": its real capacity comes after the window, so it cannot be known
        {"instance": "later", "ts": hand_made_ts(23), "capacity_blocks": 0},
        {"instance": "later", "ts": hand_made_ts(90), "capacity_blocks": 3 * capacity},
    ]
    insert_stats(tables, [{**r, "seq": i, "_offset": i} for i, r in enumerate(rows)])
    window = {"since": hand_made_ts(10), "until": hand_made_ts(60)}
    expected = {"before": capacity, "inside": 2 * capacity, "never": 0, "later": 0}

    what_if = query(tables, "capacity_what_if", fractions=[0.5], **window)
    per_source = {r["instance"]: r for r in what_if if r["instance"] != "*"}
    assert {k: int(r["capacity_blocks"]) for k, r in per_source.items()} == expected
    assert {k: int(r["extra_blocks"]) for k, r in per_source.items()} == {
        k: v // 2 for k, v in expected.items()
    }
    instances = query(tables, "report_instances", model="", **window)
    assert {r["instance"]: int(r["capacity_blocks"]) for r in instances} == expected

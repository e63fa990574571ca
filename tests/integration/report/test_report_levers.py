"""The report on simulated fleets in chDB: routing vs memory against re-runs, P/D counted once.

Bound stated before measuring (issue 47): the report's "router alone" gain (prefix-aware
routing replayed from the access stream) within 2 points of the hit-rate gain a
prefix-aware re-run of the same requests really has; "memory alone" and "both" within 2
points of re-runs with that much more memory (today's routing, and prefix-aware).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.report.build import build_report
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from support.analytics_kit import simulate_direct

ROUTER_BOUND_PP = 2.0
MEMORY_BOUND_PP = 2.0


def _rate(config: SimConfig, **changes: Any) -> float:
    rerun = dataclasses.replace(config, access_stream=False, **changes)
    return Fleet(rerun).run()["fleet"]["hit_rate"]


@pytest.mark.parametrize(
    ("instances", "workload", "params", "capacity"),
    [
        ("4", "generated-shared-prefix", {"groups": 16}, 300),
        ("3", "zipf", {"documents": 100}, 300),
        ("2p,2d", "zipf", {"documents": 100}, 300),
    ],
)
def test_router_vs_memory_against_reruns(
    clickhouse: Any,
    clickhouse_url: str,
    tmp_path: Path,
    instances: str,
    workload: str,
    params: dict,
    capacity: int,
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        workload_params=params,
        capacity_blocks=capacity,
        requests=800,
        seed=2,
    )
    truth, _ = simulate_direct(clickhouse, config)
    sizing = {"kv_bytes_per_token": 131072, "gpu_gib": 40.0}
    report, files = build_report(target, tmp_path, sizing=sizing, client=clickhouse)
    lv = report.routing.levers
    assert lv is not None and lv.routing == "fixed"
    today = truth["fleet"]["hit_rate"]
    router_pp = 100 * (lv.router - (_rate(config, routing="prefix-aware") - today))
    assert abs(router_pp) <= ROUTER_BOUND_PP, router_pp
    bigger = capacity + math.floor(capacity * lv.memory_fraction)
    memory_pp = 100 * (lv.memory - (_rate(config, capacity_blocks=bigger) - today))
    assert abs(memory_pp) <= MEMORY_BOUND_PP, memory_pp
    both = _rate(config, capacity_blocks=bigger, routing="prefix-aware")
    assert abs(100 * (lv.both - (both - today))) <= MEMORY_BOUND_PP
    # P/D: each request once (prefill side); the truth counts a finish on both sides.
    sides = 2 if "p" in instances else 1
    assert report.fleet.requests * sides == truth["fleet"]["requests_finished"]
    assert report.fleet.requests == config.requests
    markdown = files.markdown.read_text()
    assert "Prefix-aware router alone" in markdown and "GiB" in markdown
    assert report.capacity.method == "access-replay" and report.capacity.error_pp == 0.5

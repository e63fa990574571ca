"""The report on the demo's prefill/decode fleet shape, against the simulator's truth.

In a P/D fleet the decode instance looks every prompt up again; its hits save no prefill
compute. So the report's fleet hit rate is the prefill side's hits over the prompt tokens
counted once, and every saving it shows (the capacity curve, the routing figures) is the
prefill side's: checked against the truth and against re-runs with more memory or a
prefix-aware router, within the method's stated error (router: 3 points, as in
test_report_levers.py).
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
from kvscope.local.demo_scales import SCALES
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from support.analytics_kit import simulate_direct

ROUTER_BOUND_PP = 3.0


def _prefill_side(truth: dict) -> tuple[int, int]:
    """(hits, queries) of the truth's sources that prefill."""
    sides = [s for s in truth["sources"].values() if s["role"] != "decode"]
    return sum(s["prefix_hits"] for s in sides), sum(s["prefix_queries"] for s in sides)


def _rerun(config: SimConfig, **changes: Any) -> dict:
    return Fleet(dataclasses.replace(config, access_stream=False, **changes)).run()


@pytest.mark.parametrize(
    ("instances", "capacity", "requests"),
    [
        (SCALES["small"].instances, SCALES["small"].capacity_blocks, SCALES["small"].requests),
        ("1p,2d", 96, 300),
        ("2p,1d", 128, 400),
    ],
)
def test_pd_fleet_counts_prefill_once(
    clickhouse: Any,
    clickhouse_url: str,
    tmp_path: Path,
    instances: str,
    capacity: int,
    requests: int,
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(
        instances=parse_instances(instances),
        workload="generated-shared-prefix",
        routing="round-robin",
        capacity_blocks=capacity,
        requests=requests,
        seed=3,
    )
    truth, _ = simulate_direct(clickhouse, config)
    report, _ = build_report(target, tmp_path, client=clickhouse)
    fleet = report.fleet
    hits, queries = _prefill_side(truth)
    # Counted once: the prefill side's lookups are the prompt tokens, each once.
    assert queries == fleet.prompt_tokens
    assert fleet.hit_rate == pytest.approx(hits / queries, abs=1e-12)
    assert fleet.prefix_queries == queries
    assert list(fleet.records) == sorted(fleet.records)  # the same order in every report
    decode = [s for s in truth["sources"].values() if s["role"] == "decode"]
    decode_rate = sum(s["prefix_hits"] for s in decode) / sum(s["prefix_queries"] for s in decode)
    assert fleet.decode_hit_rate == pytest.approx(decode_rate, abs=1e-12)

    capacity_figures = report.capacity
    assert capacity_figures.baseline_hit_rate == fleet.hit_rate
    prefill_caps = [
        s["capacity_blocks"] for s in truth["sources"].values() if s["role"] != "decode"
    ]
    assert capacity_figures.instances == len(prefill_caps)
    bound = capacity_figures.error_pp
    assert capacity_figures.method == "access-replay" and bound is not None
    for fraction in (0.5, 1.0):
        point = next(p for p in capacity_figures.curve if p.fraction == fraction)
        assert point.extra_blocks == sum(math.floor(c * fraction) for c in prefill_caps)
        bigger = _rerun(config, capacity_blocks=capacity + math.floor(capacity * fraction))
        gained = _prefill_side(bigger)[0] - hits
        assert abs(point.tokens_saved - gained) <= bound / 100 * queries, (fraction, gained)
        assert point.hit_rate == pytest.approx((hits + point.tokens_saved) / queries)

    levers = report.routing.levers
    assert levers is not None
    routed_hits, routed_queries = _prefill_side(_rerun(config, routing="prefix-aware"))
    router_pp = 100 * (levers.router - (routed_hits / routed_queries - hits / queries))
    assert abs(router_pp) <= ROUTER_BOUND_PP, router_pp
    prefill_opportunity = sum(
        s["routing_opportunity_tokens"] for s in truth["sources"].values() if s["role"] != "decode"
    )
    assert report.routing.opportunity_tokens == prefill_opportunity
    assert report.routing.hit_rate_gain == pytest.approx(prefill_opportunity / queries)

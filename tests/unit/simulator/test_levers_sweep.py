"""The report's three levers against simulator re-runs, swept over workloads and fleets.

Bound stated before measuring (issue 47): router alone, memory alone and both, replayed
from one run's accesses, each within BOUND_PP = 2 points of re-runs of the same requests
(prefix-aware routing, more blocks per instance, both), on shared-prefix, Zipf and
multi-turn workloads, 1 to 3 prefill instances, with and without prefill/decode, caches
below the working set, one fleet already behind a prefix-aware router. Tiny scales: the
whole sweep simulates in about 10 s. docs/analytics.md, "Levers from one model".
"""

from __future__ import annotations

import pytest
from kvscope.simulator.fleet import SimConfig, parse_instances
from kvscope.simulator.whatif_check import LEVERS, measure_levers

BOUND_PP = 2.0
_CHATS = {"turns": 10.0, "user_len": 96.0, "output_len": 96.0, "think_s": 3.0}
_ZIPF = {"documents": 150.0}
CASES = {
    "shared-prefix-1p1d": ("1p,1d", "generated-shared-prefix", {}, 160, 0.3),
    "shared-prefix-2p2d": ("2p,2d", "generated-shared-prefix", {}, 192, 0.5),
    "shared-prefix-3p1d": ("3p,1d", "generated-shared-prefix", {}, 192, 0.3),
    "shared-prefix-3p2d": ("3p,2d", "generated-shared-prefix", {}, 160, 0.5),
    "shared-prefix-2": ("2", "generated-shared-prefix", {"groups": 12.0}, 160, 0.3),
    "zipf-3": ("3", "zipf", _ZIPF, 160, 0.5),
    "zipf-2p2d": ("2p,2d", "zipf", _ZIPF, 160, 0.3),
    "multi-turn-2": ("2", "multi-turn", _CHATS, 200, 0.5),
    "multi-turn-3p1d": ("3p,1d", "multi-turn", _CHATS, 200, 0.3),
}
"""name: (instances, workload, knobs, blocks per instance, extra memory as a fraction)."""


def _config(name: str, routing: str = "round-robin") -> SimConfig:
    instances, workload, knobs, blocks, _ = CASES[name]
    return SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        workload_params=dict(knobs),
        requests=250,
        rate=2.0,
        routing=routing,
        seed=7,
        capacity_blocks=blocks,
    )


@pytest.mark.parametrize("name", CASES)
def test_levers_within_two_points_of_reruns(name: str) -> None:
    check = measure_levers(_config(name), CASES[name][4])
    errors = {lever: round(check.error_pp(lever), 2) for lever in LEVERS}
    assert all(abs(e) <= BOUND_PP for e in errors.values()), (check.actual, errors)
    assert 0.0 < check.hit_rate < 1.0  # caches below the working set: something to gain


def test_levers_of_a_prefix_aware_fleet_within_two_points() -> None:
    """Already behind a prefix-aware router: no router gain, and the memory lever re-routes."""
    check = measure_levers(_config("shared-prefix-3p2d", "prefix-aware"), 0.5)
    assert abs(check.predicted["router"]) <= 0.001
    assert all(abs(check.error_pp(lever)) <= BOUND_PP for lever in LEVERS), check

"""The ground-truth recorder on hand-written events: the analytics' definitions."""

from __future__ import annotations

from kvscope.cachemodel.blockpool import PoolEvent
from kvscope.simulator.truth import TruthRecorder, quantile


def test_refaults_residency_clears_and_opportunity() -> None:
    truth = TruthRecorder()
    truth.add_source("a/0", "m", "both", 10)
    truth.add_source("b/0", "m", "both", 10)
    truth.on_events("a/0", 0, [PoolEvent("stored", [1, 2], None)], 16)
    truth.on_events("b/0", 500_000, [PoolEvent("stored", [1], None)], 16)
    truth.on_events("a/0", 1_000_000, [PoolEvent("removed", [2]), PoolEvent("removed", [1])], 16)
    truth.on_events("a/0", 2_000_000, [PoolEvent("stored", [1, 2], None)], 16)
    truth.on_events("a/0", 3_000_000, [PoolEvent("removed", [2]), PoolEvent("cleared")], 16)
    truth.on_events("a/0", 4_000_000, [PoolEvent("stored", [2], 1)], 16)
    truth.on_prefix("a/0", 100, 25)
    summary = truth.summary({})
    a = summary["sources"]["a/0"]
    assert (a["stored_blocks"], a["removed_blocks"], a["cleared"]) == (5, 3, 1)
    # 1 re-stored with no eviction after its removal (distance 0), 2 after one (distance 1);
    # the last store of 2 follows a clear: not a refault.
    assert a["refaults"] == 2 and a["refault_distances"]["max"] == 1
    assert a["residency"] == {
        "intervals": 5,
        "closed": 4,
        "ended_by_removal": 3,
        "ended_by_clear": 1,
        "open": 1,
        "p50_s": 1.0,
        "p90_s": 1.0,
        "p99_s": 1.0,
        "max_s": 1.0,
    }
    # a stored 1 again while b held it; b stored 1 while a held it
    assert a["routing_opportunity_blocks"] == 1
    assert summary["sources"]["b/0"]["routing_opportunity_blocks"] == 1
    assert summary["fleet"]["duplication_share"] == 0.0
    assert summary["fleet"]["resident_hashes"] == 2
    assert a["hit_rate"] == 0.25
    what_if = {p["extra_blocks"]: p["saved_tokens"] for p in a["what_if"]}
    assert what_if == {1: 16, 2: 32, 5: 32, 10: 32}


def test_quantile_is_numpy_linear() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert abs(quantile([1.0, 2.0, 3.0, 4.0], 0.99) - 3.97) < 1e-12
    assert quantile([], 0.5) is None

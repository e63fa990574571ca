"""Helpers for the analytics tests: run the simulator, run queries, compare with the truth.

T-digest bound asserted everywhere a quantile comes from ClickHouse: the estimate for
quantile q must lie between the sorted samples at ranks floor((q - 0.02)(n - 1)) and
ceil((q + 0.02)(n - 1)): a rank error of at most 2 percentiles, rounded outwards to whole
samples (t-digest returns a centroid's value inside a run of equal samples), widened by
1e-6 relative because ClickHouse keeps t-digest centroids as Float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvscope.collector.analytics.queries import run_query
from kvscope.simulator.fleet import Fleet, SimConfig
from kvscope.simulator.sinks import DirectSink

RANK_EPSILON = 0.02
FLOAT32_REL = 1e-6
FAR_FUTURE = "2100-01-01T00:00:00"


def simulate_direct(client: Any, config: SimConfig) -> tuple[dict, dict]:
    """Simulate `config` straight into the client's tables; (truth, raw samples)."""
    sink = DirectSink(client)
    fleet = Fleet(config, sink)
    truth = fleet.run()
    sink.close()
    return truth, fleet.truth.samples()


def query(client: Any, name: str, **params: Any) -> list[dict]:
    """Run a query with `until` far in the future (censoring after every event)."""
    return run_query(client, name, {"until": FAR_FUTURE, **params})


def by_source(rows: list[dict]) -> dict[str, dict]:
    """Rows keyed like the truth's sources: `instance/dp_rank`."""
    return {f"{r['instance']}/{r['dp_rank']}": r for r in rows}


def assert_quantile(estimate: float, samples: Sequence[float], q: float, what: str) -> None:
    """Assert a ClickHouse t-digest quantile is within the stated bound of the exact one."""
    assert samples, f"{what}: no samples"
    last = len(samples) - 1
    lo = samples[math.floor(max(0.0, q - RANK_EPSILON) * last)]
    hi = samples[math.ceil(min(1.0, q + RANK_EPSILON) * last)]
    slack = FLOAT32_REL * max(abs(lo), abs(hi)) + 1e-9
    assert lo - slack <= estimate <= hi + slack, f"{what}: q{q} = {estimate} not in [{lo}, {hi}]"


def assert_matches_truth(client: Any, truth: dict, samples: dict) -> None:
    """Every analytics query against the simulator's ground truth (see the module doc)."""
    sources = truth["sources"]
    residency = by_source(query(client, "residency"))
    churn = by_source(query(client, "eviction_churn"))
    refaults = by_source(query(client, "refaults"))
    opportunity = by_source(query(client, "routing_opportunity"))
    hit = by_source(query(client, "hit_rate"))
    assert set(residency) == {k for k, s in sources.items() if s["stored_blocks"]}
    for key, src in sources.items():
        res = src["residency"]
        if src["stored_blocks"]:
            row = residency[key]
            counts = (row["intervals"], row["ended_by_removal"], row["ended_by_clear"])
            assert counts == (res["intervals"], res["ended_by_removal"], res["ended_by_clear"])
            assert row["still_resident"] == res["open"], key
            for q, col in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s")):
                assert_quantile(row[col], samples["residency_s"][key], q, f"{key} residency")
            assert refaults[key]["refaults"] == src["refaults"], key
            if src["refaults"]:
                for q, col in ((0.5, "distance_p50"), (0.9, "distance_p90")):
                    dist = samples["refault_distance"][key]
                    assert_quantile(refaults[key][col], dist, q, f"{key} refault distance")
            assert opportunity[key]["opportunity_blocks"] == src["routing_opportunity_blocks"]
        c = churn[key]
        assert (c["stores"], c["removals"], c["clears"]) == (
            src["stored_blocks"],
            src["removed_blocks"],
            src["cleared"],
        ), key
        assert abs(hit[key]["hit_rate"] - src["hit_rate"]) < 1e-3, key
    assert abs(hit["*/0"]["hit_rate"] - truth["fleet"]["hit_rate"]) < 1e-3
    assert hit["*/0"]["requests"] == truth["fleet"]["requests_finished"]
    _assert_what_if(client, truth)
    _assert_duplication(client, truth)
    _assert_transfers(client, truth, samples)
    for row in query(client, "completeness"):
        assert row["completeness"] == 1.0 and row["undeclared_missing"] == 0, row


def _assert_what_if(client: Any, truth: dict) -> None:
    rows = query(client, "capacity_what_if")
    replayed = bool(truth["config"].get("access_stream"))
    for row in rows:  # the access stream arrived (and was used) exactly when it was published
        assert row["method"].startswith("access-replay") == replayed, row
        assert row["error_pp"] is not None
    got = {(f"{r['instance']}/{r['dp_rank']}", r["fraction"]): r for r in rows}
    for key, src in truth["sources"].items():
        for point in src["what_if"]:
            row = got[(key, point["fraction"])]
            assert row["extra_blocks"] == point["extra_blocks"], key
            assert row["saved_tokens"] == point["saved_tokens"], key
            assert row["saved_tokens_corrected"] == point["saved_tokens_corrected"], key
            assert abs(row["predicted_hit_rate_first"] - point["predicted_hit_rate"]) < 1e-9
    for point in truth["fleet"]["what_if"]:
        row = got[("*/0", point["fraction"])]
        assert abs(row["predicted_hit_rate_first"] - point["predicted_hit_rate"]) < 1e-9
        corrected = point["predicted_hit_rate_corrected"]
        assert abs(row["predicted_hit_rate_corrected"] - corrected) < 1e-9


def _assert_duplication(client: Any, truth: dict) -> None:
    rows = query(client, "duplication")
    resident = sum(r["resident_hashes"] for r in rows)
    duplicated = sum(r["duplicated_hashes"] for r in rows)
    fleet = truth["fleet"]
    assert resident == fleet["resident_hashes"]
    assert abs(duplicated / resident - fleet["duplication_share"]) < 1e-9


def _assert_transfers(client: Any, truth: dict, samples: dict) -> None:
    rows = query(client, "transfer_latency", bucket_s=86400 * 365)
    got = {f"{r['src_instance']}->{r['dst_instance']}": r for r in rows}
    assert set(got) == set(truth["transfers"])
    for pair, t in truth["transfers"].items():
        row = got[pair]
        assert (row["transfers"], row["bytes"]) == (t["count"], t["bytes"]), pair
        for q, col in ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")):
            assert_quantile(row[col], samples["transfer_ms"][pair], q, f"{pair} latency")
        assert abs(row["max_ms"] - t["max_ms"]) < 1e-6

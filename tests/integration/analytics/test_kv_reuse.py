"""`kv_reuse`: KV age at hit and at eviction and reuse count at eviction, per source.

A simulated fleet (access stream on) goes straight into chDB; the oracle recomputes the
query's definitions from the stored rows in Python: for each hit (a leading hit hash of
an access) the last store of that hash on the source at or before the lookup, for each
removal the last store before it and the hits on that stored copy.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from typing import Any

import pytest
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import by_source, query, simulate_direct


def oracle(tables: Any) -> dict[str, dict[str, Any]]:
    """Per source: hit ages, eviction ages and reuse counts (seconds, counts)."""
    stores: dict[tuple[str, int], list[int]] = defaultdict(list)
    removals = []
    rows = tables.query(
        "SELECT instance, dp_rank, toString(event), block_hash, toUnixTimestamp64Micro(ts)"
        " FROM kv_block_events WHERE event IN ('stored', 'removed')"
    ).result_rows
    for instance, rank, event, block_hash, ts in rows:
        key = (f"{instance}/{rank}", block_hash)
        if event == "stored":
            stores[key].append(ts)
        else:
            removals.append((key, ts))
    for times in stores.values():
        times.sort()

    def last_store(key: tuple[str, int], at: int) -> int | None:
        times = stores.get(key, [])
        i = bisect.bisect_right(times, at)
        return times[i - 1] if i else None

    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"hit_ages": [], "eviction_ages": [], "reuse": []}
    )
    reused: Counter[tuple[tuple[str, int], int]] = Counter()
    accesses = tables.query(
        "SELECT instance, dp_rank, toUnixTimestamp64Micro(lookup_ts), hit_blocks, block_hashes"
        " FROM kv_accesses"
    ).result_rows
    for instance, rank, lookup, hit_blocks, hashes in accesses:
        for h in hashes[:hit_blocks]:
            key = (f"{instance}/{rank}", h)
            stored = last_store(key, lookup)
            if stored is not None:
                out[key[0]]["hit_ages"].append((lookup - stored) / 1e6)
                reused[(key, stored)] += 1
    for key, ts in removals:
        stored = last_store(key, ts)
        if stored is not None:
            out[key[0]]["eviction_ages"].append((ts - stored) / 1e6)
            out[key[0]]["reuse"].append(reused[(key, stored)])
    return out


def assert_quantile(value: float, samples: list[float], q: float) -> None:
    ordered = sorted(samples)
    rank = q * (len(ordered) - 1)
    low, high = ordered[math.floor(rank)], ordered[math.ceil(rank)]
    lower = ordered[max(0, math.floor(rank) - 1)]
    assert lower - 1e-6 <= value <= high + 1e-6, (value, low, high)


@pytest.mark.parametrize(
    ("workload", "instances", "capacity"),
    [("generated-shared-prefix", "2", 200), ("zipf", "1", 120), ("multi-turn", "1p,1d", 300)],
)
def test_kv_reuse_matches_the_stored_rows(
    tables: Any, workload: str, instances: str, capacity: int
) -> None:
    config = SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        requests=300,
        capacity_blocks=capacity,
        seed=9,
    )
    simulate_direct(tables, config)
    rows = by_source(query(tables, "kv_reuse", since="1970-01-01 00:00:00"))
    expected = oracle(tables)
    assert set(rows) == {k for k, v in expected.items() if v["hit_ages"] or v["eviction_ages"]}
    assert any(v["reuse"] for v in expected.values()), "the shapes evict"
    for source, row in rows.items():
        want = expected[source]
        assert row["hits"] == len(want["hit_ages"])
        assert row["evictions"] == len(want["eviction_ages"])
        if want["hit_ages"]:
            assert_quantile(row["hit_age_p50_s"], want["hit_ages"], 0.5)
            assert_quantile(row["hit_age_p90_s"], want["hit_ages"], 0.9)
        if want["reuse"]:
            assert_quantile(row["eviction_age_p50_s"], want["eviction_ages"], 0.5)
            mean = sum(want["reuse"]) / len(want["reuse"])
            assert row["mean_reuse_at_eviction"] == pytest.approx(mean)
            never = sum(1 for r in want["reuse"] if r == 0) / len(want["reuse"])
            assert row["never_reused_share"] == pytest.approx(never)

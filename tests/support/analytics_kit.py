"""Helpers for the analytics tests: run the simulator, run queries, compare with the truth.

T-digest bound asserted everywhere a quantile comes from ClickHouse: the estimate for
quantile q must lie between the sorted samples at ranks floor((q - 0.02)(n - 1)) and
ceil((q + 0.02)(n - 1)): a rank error of at most 2 percentiles, rounded outwards to whole
samples (t-digest returns a centroid's value inside a run of equal samples), widened by
1e-6 relative because ClickHouse keeps t-digest centroids as Float32.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvscope.analytics.queries import run_query
from kvscope.collector.pipeline.direct_sink import DirectSink
from kvscope.simulator.fleet import Fleet, SimConfig

RANK_EPSILON = 0.02
FLOAT32_REL = 1e-6
FAR_FUTURE = "2100-01-01T00:00:00"


BLOCK_EVENT_DEFAULTS: dict[str, Any] = {
    "instance": "x", "dp_rank": 0, "model": "m", "role": "both", "engine": "vllm", "epoch": 1,
    "seq": 0, "event_index": 0, "position": 0, "event": "stored", "block_hash": 0,
    "parent_hash": 0, "block_size": 16, "medium": "GPU", "_topic": "t", "_partition": 0,
    "_offset": 0,
}  # fmt: skip
"""The columns a hand-made `kv_block_events` row leaves unset (`ts` has no default)."""


GRANULES = re.compile(r"Granules: (\d+)/(\d+)")


@dataclass(frozen=True)
class KeyRead:
    """One read of a MergeTree table in an `EXPLAIN indexes = 1` plan, as its primary key
    narrows it: the key condition ClickHouse uses and the granules it selects of all."""

    table: str
    condition: str
    selected: int
    total: int


def key_reads(plan: Sequence[str]) -> list[KeyRead]:
    """Every table read of an `EXPLAIN indexes = 1` plan (its lines), with its primary-key
    step; a read the primary key does not narrow shows condition "true" and all granules."""
    reads: list[KeyRead] = []
    table, section, condition = None, "", ""
    for line in plan:
        text = line.strip(" │└├─")
        if text.startswith("ReadFromMergeTree"):
            table = text.rstrip(")").rpartition(".")[2]
        elif text in ("Min-Max", "Partition", "PrimaryKey", "Skip"):
            section = text
        elif table is not None and section == "PrimaryKey":
            if text.startswith("Condition:"):
                condition = text.removeprefix("Condition:").strip()
            elif match := GRANULES.match(text):
                reads.append(KeyRead(table, condition, int(match[1]), int(match[2])))
                table, section = None, ""
    return reads


def explain_key_reads(client: Any, sql: str, params: Mapping[str, Any]) -> list[KeyRead]:
    """`key_reads` of `sql`'s plan with `params` bound."""
    plan = client.query(f"EXPLAIN indexes = 1 {sql}", parameters=params).result_rows
    return key_reads([row[0] for row in plan])


HAND_MADE_T0_US = 1_700_000_000_000_000
"""The instant hand-made block events count their seconds from (2023-11-14, UTC)."""


def hand_made_ts(seconds: float) -> dt.datetime:
    """The timestamp `seconds` after HAND_MADE_T0_US, for hand-made block events."""
    return dt.datetime.fromtimestamp((HAND_MADE_T0_US + seconds * 1_000_000) / 1e6, dt.UTC)


def insert_block_events(client: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert hand-made `kv_block_events` rows in one insert: each row maps the columns it
    sets (`ts` at least) and takes BLOCK_EVENT_DEFAULTS for the rest; `tokens` defaults to
    16 for a store and 0 otherwise."""
    columns = [*BLOCK_EVENT_DEFAULTS, "ts", "tokens"]
    data = []
    for row in rows:
        full = {**BLOCK_EVENT_DEFAULTS, **row}
        full.setdefault("tokens", 16 if full["event"] == "stored" else 0)
        data.append([full[c] for c in columns])
    client.insert("kv_block_events", data, column_names=columns)


def simulate_direct(client: Any, config: SimConfig) -> tuple[dict, dict]:
    """Simulate `config` straight into the client's tables; (truth, raw samples)."""
    fleet, truth = run_direct(client, config)
    return truth, fleet.truth.samples()


def run_direct(client: Any, config: SimConfig) -> tuple[Fleet, dict]:
    """Simulate `config` straight into the client's tables; the finished fleet (its
    `truth` recorder answers what the summary does not hold) and the truth summary."""
    sink = DirectSink(client)
    fleet = Fleet(config, sink)
    truth = fleet.run()
    sink.close()
    return fleet, truth


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
    """Every analytics query against the simulator's ground truth (see the module doc).

    Counts, sums, maxima and ratios of integers are compared with `==` (the same IEEE
    division on both sides); only t-digest quantiles get the rank bound above.
    """
    sources = truth["sources"]
    residency = by_source(query(client, "residency"))
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
            assert row["closed"] == res["closed"], key
            assert row["max_s"] == res["max_s"], key
            for q, col in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s")):
                if res["max_s"] is None:  # no closed interval: no quantile either
                    assert math.isnan(row[col]), key
                else:
                    assert_quantile(row[col], samples["residency_s"][key], q, f"{key} residency")
            _assert_refaults(refaults[key], src, samples["refault_distance"][key], key)
            opp = opportunity[key]
            assert opp["opportunity_blocks"] == src["routing_opportunity_blocks"], key
            assert opp["opportunity_tokens"] == src["routing_opportunity_tokens"], key
            assert opp["stored_tokens"] == src["stored_tokens"], key
            assert opp["stores"] == src["stored_blocks"], key
        assert hit[key]["hit_rate"] == src["hit_rate"], key
        assert (hit[key]["prefix_queries"], hit[key]["prefix_hits"]) == (
            src["prefix_queries"],
            src["prefix_hits"],
        ), key
    fleet = truth["fleet"]
    assert hit["*/0"]["hit_rate"] == fleet["hit_rate"]
    assert hit["*/0"]["requests"] == fleet["requests_finished"]
    assert (
        sum(r["opportunity_tokens"] for r in opportunity.values())
        == (fleet["routing_opportunity_tokens"])
    )
    _assert_churn(client, sources)
    _assert_what_if(client, truth)
    _assert_duplication(client, truth)
    _assert_transfers(client, truth, samples)
    _assert_completeness(client, sources)


def _assert_refaults(row: dict, src: dict, distances: list[float], key: str) -> None:
    truth = src["refault_distances"]
    assert row["refaults"] == src["refaults"] == truth["count"], key
    assert row["refault_tokens"] == truth["tokens"], key
    assert row["refault_share"] == src["refaults"] / src["stored_blocks"], key
    assert row["distance_max"] == truth["max"], key
    if not src["refaults"]:
        return
    for q, col in ((0.5, "distance_p50"), (0.9, "distance_p90"), (0.99, "distance_p99")):
        assert_quantile(row[col], distances, q, f"{key} refault distance")


def _assert_churn(client: Any, sources: dict) -> None:
    """eviction_churn and its timeline: exact counts, rates and ratios per source."""
    churn = by_source(query(client, "eviction_churn"))
    active = {k for k, s in sources.items() if s["active_minutes"]}
    assert set(churn) == active
    timeline: dict[str, list[dict]] = {}
    for row in query(client, "eviction_churn_timeline", bucket_s=60):
        timeline.setdefault(f"{row['instance']}/{row['dp_rank']}", []).append(row)
    assert set(timeline) == active
    for key in active:
        src, row = sources[key], churn[key]
        totals = (src["stored_blocks"], src["removed_blocks"], src["cleared"])
        assert (row["stores"], row["removals"], row["clears"]) == totals, key
        assert row["removals_per_s"] == src["removals_per_s"], key
        assert row["churn_ratio"] == (src["churn_ratio"] if src["stored_blocks"] else None), key
        buckets = timeline[key]
        starts = [int(b["bucket"].timestamp()) for b in buckets]
        assert starts == src["active_minutes"], key
        sums = tuple(sum(b[c] for b in buckets) for c in ("stores", "removals", "clears"))
        assert sums == totals, key
        for b in buckets:
            assert b["removals_per_s"] == b["removals"] / 60, key
            assert b["churn_ratio"] == (b["removals"] / b["stores"] if b["stores"] else None)


def _assert_completeness(client: Any, sources: dict) -> None:
    """One complete kv-events row per source with events; every stream row complete."""
    rows = query(client, "completeness")
    kv = {f"{r['instance']}/{r['dp_rank']}" for r in rows if r["stream"] == "kv-events"}
    assert kv == {k for k, s in sources.items() if s["active_minutes"]}
    for row in rows:
        assert row["present"] == row["expected"] == row["last_seq"] - row["first_seq"] + 1, row
        assert (row["declared_lost"], row["undeclared_missing"]) == (0, 0), row
        assert row["completeness"] == 1.0, row


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

"""Gather the report's figures from the SQL queries (the same ones `kvscope query` runs).

No analytics SQL lives here: every number comes from `sql/queries/*.sql` through
`kvscope.analytics.queries.run_query`, with the report's window and model as parameters,
so the report shows exactly what `kvscope query NAME` prints for the same parameters.
This module only reshapes rows into the `model` structs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, overload

import msgspec
from kvscope.analytics import whatif
from kvscope.analytics.report import advice, planner
from kvscope.analytics.report.model import (
    Bucket,
    CapacityFigures,
    ChurnPoint,
    Completeness,
    DuplicationRow,
    FleetSummary,
    HalfFigures,
    InstanceFigures,
    InstanceInfo,
    LatencyPoint,
    LeverFigures,
    PairLatency,
    Report,
    ReportParams,
    RoutingFigures,
    TimePoint,
    TransferFigures,
    WhatIfPoint,
)
from kvscope.analytics.report.progress import StepProgress
from kvscope.analytics.report.replayed import Replayed
from kvscope.cachemodel.whatif import WHAT_IF_FRACTIONS
from kvscope.cachemodel.whatif import levers as lever_gains
from kvscope.collector.storage.client import Client
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

TIME_BUCKETS = 60
"""Time series are cut into about this many buckets over the window."""
STEPS = 9
CURVE_FRACTIONS = sorted(
    {round(0.05 * i, 2) for i in range(21)} | {1.25, 1.5, 2.0, 3.0, 4.0} | set(WHAT_IF_FRACTIONS)
)
"""The report's finer what-if curve (fractions of current capacity); includes the defaults."""
ONE_BUCKET_S = 4_000_000_000
"""A bucket longer than any window: `transfer_latency` then gives one row per pair."""
FLEET = "*"
"""The fleet row's instance in `hit_rate` and `capacity_what_if`."""


@overload
def _utc(value: datetime) -> datetime: ...
@overload
def _utc(value: None) -> None: ...
def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200)


def bucket_seconds(start: datetime, end: datetime, minimum_s: int = 60) -> int:
    """A round time-bucket length of at least `minimum_s` giving at most about
    `TIME_BUCKETS` buckets over the window. The default minimum of one minute is the
    resolution of the per-minute aggregates that several queries read."""
    span = max((end - start).total_seconds(), 1.0)
    for step in _BUCKETS_S:
        if step >= minimum_s and span / step <= TIME_BUCKETS:
            return step
    return 86400


class _Queries:
    """Runs named queries with the report's window, model and bucket as parameters.

    Each query gets only the parameters it declares (the rest keep `kvscope query`'s
    defaults), so `kvscope query NAME --param ...` with the same values gives the same rows.
    """

    def __init__(self, client: Client, params: dict[str, Any]) -> None:
        self._client = client
        self.params = params

    def rows(self, name: str, **extra: Any) -> list[dict[str, Any]]:
        from kvscope.analytics.queries import load_query, run_query

        wanted = load_query(name).params
        given = {k: v for k, v in {**self.params, **extra}.items() if k in wanted}
        return run_query(self._client, name, given)


def resolve_window(
    client: Client, params: ReportParams, now: datetime
) -> tuple[datetime, datetime]:
    """The report's window: the part of the flags' window (by default everything) that holds
    data, from its first to just after its last stored row. Rates, warm-up, halves and the
    trend are all measured over it: `--since 2h` on 19 s of data is a 19 s window."""
    from kvscope.analytics.queries import run_query

    since = params.since or datetime(1970, 1, 1, tzinfo=UTC)
    until = params.until or now + timedelta(days=3650)
    rows = run_query(
        client, "report_span", {"since": since, "until": until, "model": params.model or ""}
    )
    present = [r for r in rows if r["rows"]]
    if not present:
        raise ConfigError(
            "no kvscope data in this window"
            + (f" for model {params.model!r}" if params.model else "")
            + ": widen the window (since, until), check the model name, or run "
            "`kvscope collect` first"
        )
    first = min(_utc(r["first_ts"]) for r in present)
    last = max(_utc(r["last_ts"]) for r in present)
    return max(since, first), min(until, last + timedelta(microseconds=1))


def gather_report(
    client: Client, params: ReportParams, progress: StepProgress, now: datetime
) -> Report:
    """Run the queries and build the `Report`."""
    progress.step("report: running queries", total=STEPS)
    since, until = resolve_window(client, params, now)
    bucket_s = bucket_seconds(since, until)
    usage_bucket_s = bucket_seconds(since, until, minimum_s=1)
    queries = _Queries(
        client, {"since": since, "until": until, "model": params.model or "", "bucket_s": bucket_s}
    )
    completeness = _completeness(queries)
    progress.advance()
    fleet, hit_rows = _fleet(queries, completeness)
    progress.advance()
    instances = _instances(queries, completeness, fleet, hit_rows, usage_bucket_s)
    progress.advance()
    capacity, sources = _capacity(queries, params, completeness, fleet)
    progress.advance()
    plan = planner.planner(
        capacity,
        params,
        queries.rows("report_request_timing"),
        fleet.requests,
        [i for i in fleet.instances if prefill_side(i.role)],
    )
    if params.gpu_gib and plan.bytes_per_block is None:
        log.warning(
            "--gpu-gib %g cannot count GPUs: the KV bytes per block are unknown (give "
            "--model-config or --kv-layers/--kv-heads/--head-dim)",
            params.gpu_gib,
        )
    accesses, clears = whatif.load_accesses(lambda n, p: queries.rows(n, **p), queries.params)
    replayed = Replayed(accesses, clears, sources)
    halves = [
        _half(client, queries, params, completeness, a, b, replayed)
        for a, b in planner.halves_of(since, until)
    ]
    progress.advance()
    prefill = {i.instance for i in fleet.instances if prefill_side(i.role)}
    # The end of the first bucket with an eviction: full by then (bucket_s resolution).
    first_evictions = [
        next((p.t + timedelta(seconds=bucket_s) for p in f.churn if p.removals), None)
        for f in instances
        if f.instance in prefill
    ]
    warm_up = planner.warm_up_s(first_evictions, since, until)
    doubt = planner.uncertainty(capacity, since, warm_up, halves, resolution_s=bucket_s)
    capacity = msgspec.structs.replace(
        capacity,
        recommendation=advice.recommendation(
            capacity.baseline_hit_rate,
            capacity.curve,
            capacity.target_hit_rate,
            capacity.knee_fraction,
            capacity.error_pp,
            planner=plan,
            warnings=doubt.warnings,
            instances=capacity.instances,
        ),
    )
    trend_s, _ = planner.trend_bucket(since, until)
    trend = planner.trend(queries.rows("report_trend", bucket_s=trend_s), since, until)
    progress.advance()
    routing = _routing(queries, completeness, fleet, capacity, replayed)
    progress.advance()
    transfers = _transfers(queries, params.transfer_slo_ms, completeness)
    progress.advance()
    findings = advice.findings(
        fleet, instances, capacity.recommendation, routing, transfers, params.min_transfers
    )
    progress.advance()
    return Report(
        generated_at=now,
        params=params,
        since=since,
        until=until,
        bucket_s=bucket_s,
        usage_bucket_s=usage_bucket_s,
        fleet=fleet,
        instances=instances,
        capacity=capacity,
        routing=routing,
        transfers=transfers,
        findings=findings,
        planner=plan,
        uncertainty=doubt,
        trend=trend,
    )


def _half(
    client: Client,
    queries: _Queries,
    params: ReportParams,
    completeness: _Completeness,
    since: datetime,
    until: datetime,
    replayed: Replayed,
) -> HalfFigures:
    """The hit rate and the recommended capacity of one part of the window: with an access
    stream, replayed from the state the caches had when the part began (the accesses before
    it fill the pools), not from cold caches; else from the refault model over the part."""
    part = _Queries(client, {**queries.params, "since": since, "until": until})
    fleet, _ = _fleet(part, completeness)
    capacity = replayed.capacity()
    if not capacity or not fleet.prefix_queries:
        figures, _ = _capacity(part, params, completeness, fleet)
        return HalfFigures(since, until, fleet.hit_rate, figures.fraction_for_target)
    needed = replayed.fraction_reaching(
        since, until, fleet.prefix_hits, fleet.prefix_queries, params.target_hit_rate
    )
    return HalfFigures(since, until, fleet.hit_rate, needed)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


class _Completeness:
    """The `completeness` rows, summed over whichever sources and streams a section uses."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = rows

    def of(self, instance: str | None = None, streams: tuple[str, ...] = ()) -> Completeness:
        rows = [
            r
            for r in self._rows
            if (instance is None or r["instance"] == instance)
            and (not streams or r["stream"] in streams)
        ]
        expected = sum(int(r["expected"]) for r in rows)
        present = sum(int(r["present"]) for r in rows)
        share = present / expected if expected else 1.0
        return Completeness(share=share, sources=len(rows), missing=max(expected - present, 0))


def _completeness(queries: _Queries) -> _Completeness:
    return _Completeness(queries.rows("completeness"))


def prefill_side(role: str) -> bool:
    """Whether an instance of `role` prefills (prefill or both). In a prefill/decode fleet
    the decode instance looks every prompt up again; only the prefill side's hits save
    prefill compute, so only it counts in the fleet's hit rate and savings."""
    return role != "decode"


def _sum(rows: list[dict[str, Any]], column: str) -> int:
    return sum(int(r.get(column) or 0) for r in rows)


def _fleet(queries: _Queries, completeness: _Completeness) -> tuple[FleetSummary, dict[str, Any]]:
    span = [r for r in queries.rows("report_span") if r["rows"]]
    infos = [
        InstanceInfo(
            instance=r["instance"],
            role=r["role"],
            model=r["model"],
            capacity_blocks=int(r["capacity_blocks"] or 0),
            block_size=int(r["block_size"] or 0),
        )
        for r in queries.rows("report_instances")
    ]
    rows = [r for r in queries.rows("hit_rate") if r["instance"] != FLEET]
    hit_rows = {r["instance"]: r for r in rows}
    roles: dict[str, int] = defaultdict(int)
    for info in infos:
        roles[info.role] += 1
    decoders = {i.instance for i in infos if not prefill_side(i.role)}
    # P/D: a request is finished and looked up on both sides; count it (and its prompt) once,
    # on the prefill side.
    served = [r for r in rows if r["instance"] not in decoders]
    decode = [r for r in rows if r["instance"] in decoders]
    queried, hits = _sum(served, "prefix_queries"), _sum(served, "prefix_hits")
    summary = FleetSummary(
        instances=infos,
        models=sorted({i.model for i in infos}),
        roles=dict(roles),
        start=min((_utc(r["first_ts"]) for r in span), default=None),
        end=max((_utc(r["last_ts"]) for r in span), default=None),
        records={r["table"]: int(r["rows"]) for r in sorted(span, key=lambda r: r["table"])},
        hit_rate=_ratio(hits, queried),
        completeness=completeness.of(),
        requests=_sum(served, "requests"),
        prompt_tokens=_sum(served, "prompt_tokens"),
        prefix_queries=queried,
        prefix_hits=hits,
        decode_hit_rate=_ratio(_sum(decode, "prefix_hits"), _sum(decode, "prefix_queries")),
    )
    return summary, hit_rows


def _by_instance(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["instance"]].append(row)
    return grouped


def _instances(
    queries: _Queries,
    completeness: _Completeness,
    fleet: FleetSummary,
    hit_rows: dict[str, dict[str, Any]],
    usage_bucket_s: int,
) -> list[InstanceFigures]:
    usage = _by_instance(queries.rows("report_usage", bucket_s=usage_bucket_s))
    residency = _by_instance(queries.rows("report_residency_histogram"))
    timeline = _by_instance(queries.rows("eviction_churn_timeline"))
    churn = _by_instance(queries.rows("eviction_churn"))
    figures = []
    for info in fleet.instances:
        name = info.instance
        hits = hit_rows.get(name, {})
        stores = sum(int(r["stores"]) for r in churn.get(name, []))
        removals = sum(int(r["removals"]) for r in churn.get(name, []))
        per_bucket: dict[datetime, list[int]] = defaultdict(lambda: [0, 0])
        for row in timeline.get(name, []):
            per_bucket[row["bucket"]][0] += int(row["stores"])
            per_bucket[row["bucket"]][1] += int(row["removals"])
        figures.append(
            InstanceFigures(
                instance=name,
                role=info.role,
                hit_rate=hits.get("hit_rate"),
                usage=[TimePoint(_utc(r["t"]), float(r["usage"])) for r in usage.get(name, [])],
                residency_s=[
                    Bucket(float(r["lo_s"]), float(r["hi_s"]), int(r["blocks"]))
                    for r in residency.get(name, [])
                    if r["lo_s"] is not None
                ],
                still_resident=sum(
                    int(r["blocks"]) for r in residency.get(name, []) if r["lo_s"] is None
                ),
                churn=[ChurnPoint(_utc(t), s, r) for t, (s, r) in sorted(per_bucket.items())],
                churn_ratio=_ratio(removals, stores),
                completeness=completeness.of(instance=name),
            )
        )
    return figures


def _capacity(
    queries: _Queries, params: ReportParams, completeness: _Completeness, fleet: FleetSummary
) -> tuple[CapacityFigures, list[dict[str, Any]]]:
    """The fleet curve (best estimate, its method and error) and the per-source rows of the
    instances that prefill: the curve sums only those (a decode-side hit saves no prefill)."""
    decoders = {i.instance for i in fleet.instances if not prefill_side(i.role)}
    rows = queries.rows("capacity_what_if", fractions=CURVE_FRACTIONS)
    sources = [r for r in rows if r["instance"] not in decoders | {FLEET}]
    by_fraction: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in sources:
        by_fraction[float(r["fraction"])].append(r)
    queried = fleet.prefix_queries
    curve = [
        WhatIfPoint(
            fraction=fraction,
            extra_blocks=_sum(points, "extra_blocks"),
            hit_rate=(fleet.prefix_hits + saved) / queried,
            tokens_saved=saved,
        )
        for fraction, points in sorted(by_fraction.items())
        for saved in [_sum(points, "predicted_saved_tokens")]
        if queried
    ]
    baseline = fleet.hit_rate
    knee_at = advice.knee(curve)
    target = params.target_hit_rate
    window = queries.params["until"] - queries.params["since"]
    if fleet.start and fleet.end:
        window = min(window, fleet.end - fleet.start)
    # Sources the replay could not cover keep the refault model: the worse error stands.
    worst = max(sources, key=lambda r: r["error_pp"] or 0.0, default=None)
    error = worst["error_pp"] if worst else None
    method = worst["method"] if worst else "refault-corrected"
    basis = worst.get("error_basis", "simulator") if worst else "simulator"
    return (
        CapacityFigures(
            baseline_hit_rate=baseline,
            curve=curve,
            target_hit_rate=target,
            fraction_for_target=advice.fraction_for_target(curve, target),
            knee_fraction=knee_at,
            recommendation=advice.recommendation(baseline, curve, target, knee_at, error),
            completeness=completeness.of(streams=("kv-events", "engine-stats", "kv-accesses")),
            method=method,
            error_pp=error,
            error_basis=basis,
            window_s=max(window.total_seconds(), 1e-6),
            block_size=max((i.block_size for i in fleet.instances), default=0),
            instances=len({(r["instance"], r["dp_rank"]) for r in sources}),
        ),
        sources,
    )


def _routing(
    queries: _Queries,
    completeness: _Completeness,
    fleet: FleetSummary,
    capacity: CapacityFigures,
    replayed: Replayed,
) -> RoutingFigures:
    duplication = [
        DuplicationRow(
            model=r["model"],
            role=r["role"],
            resident_hashes=int(r["resident_hashes"]),
            duplicated_hashes=int(r["duplicated_hashes"]),
            share=r["duplication_share"],
        )
        for r in queries.rows("duplication")
    ]
    decoders = {i.instance for i in fleet.instances if not prefill_side(i.role)}
    opportunity = [r for r in queries.rows("routing_opportunity") if r["instance"] not in decoders]
    tokens = _sum(opportunity, "opportunity_tokens")
    return RoutingFigures(
        duplication=duplication,
        stores=_sum(opportunity, "stores"),
        opportunity_blocks=_sum(opportunity, "opportunity_blocks"),
        opportunity_tokens=tokens,
        hit_rate_gain=_ratio(tokens, fleet.prefix_queries),
        completeness=completeness.of(streams=("kv-events", "engine-stats")),
        levers=_levers(capacity, replayed),
    )


def _levers(capacity: CapacityFigures, replayed: Replayed) -> LeverFigures | None:
    """Router alone, memory alone, both: from the access replay of the instances that
    prefill (None without accesses)."""
    accesses, clears = replayed.accesses, replayed.clears
    sizes = replayed.capacity()
    if not sizes:
        return None
    router = lever_gains(accesses, clears, sizes, {}).router
    base = capacity.baseline_hit_rate or 0.0
    fractions = [p.fraction for p in capacity.curve if p.fraction > 0]
    matching = [
        p.fraction for p in capacity.curve if p.fraction > 0 and p.hit_rate - base >= router
    ]
    fraction = matching[0] if matching else max(fractions, default=0.0)
    extra = {k: int(v * fraction) for k, v in sizes.items()}
    levers = lever_gains(accesses, clears, sizes, extra)
    return LeverFigures(
        levers.router,
        fraction,
        levers.memory,
        levers.both,
        levers.routing,
        round_robin=levers.round_robin,
        guesser=levers.guesser,
        router_affinity=levers.affinity,
    )


def _transfers(queries: _Queries, slo_ms: float, completeness: _Completeness) -> TransferFigures:
    breaches = {
        (r["src_instance"], r["dst_instance"]): int(r["breaches"])
        for r in queries.rows("report_transfer_breaches", slo_ms=slo_ms)
    }
    pairs = [
        PairLatency(
            src=r["src_instance"],
            dst=r["dst_instance"],
            transfers=int(r["transfers"]),
            p50_ms=float(r["p50_ms"]),
            p99_ms=float(r["p99_ms"]),
            max_ms=float(r["max_ms"]),
            gbps=r["gbps_p50"],
            breaches=breaches.get((r["src_instance"], r["dst_instance"]), 0),
        )
        for r in queries.rows("transfer_latency", bucket_s=ONE_BUCKET_S)
    ]
    pairs.sort(key=lambda p: (-p.p99_ms, p.src, p.dst))
    timeline = [
        LatencyPoint(
            src=r["src_instance"],
            dst=r["dst_instance"],
            t=_utc(r["bucket"]),
            p50_ms=float(r["p50_ms"]),
            p99_ms=float(r["p99_ms"]),
            transfers=int(r["transfers"]),
        )
        for r in queries.rows("transfer_latency")
    ]
    return TransferFigures(
        slo_ms=slo_ms,
        pairs=pairs,
        timeline=timeline,
        transfers=sum(p.transfers for p in pairs),
        breaches=sum(breaches.values()),
        completeness=completeness.of(streams=("kv-transfers",)),
    )

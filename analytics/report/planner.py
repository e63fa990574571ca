"""The report in a planner's units, how far to trust it, and its trend: arithmetic on rows.

GiB and whole GPUs need the KV bytes of a block: from the model's shape given as flags
(`--model-config` or `--kv-layers` ...), else from the bytes per block the engines' own
KV transfers carried (`report_request_timing`). GPU time saved needs a prefill
throughput: `--prefill-tokens-per-gpu-s`, else the one the stored request timings show
(uncached prompt tokens / prefill seconds, one GPU per instance). No SQL here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from kvscope.analytics.report.model import (
    CapacityFigures,
    HalfFigures,
    InstanceInfo,
    PlannerFigures,
    PlannerRow,
    ReportParams,
    RequestTiming,
    Trend,
    TrendPoint,
    Uncertainty,
    WhatIfPoint,
)
from kvscope.analytics.report.sizing import GIB

SHORT_WINDOW_S = 3600.0
"""A window shorter than an hour holds no daily pattern: the report warns."""
WARM_UP_SHARE = 0.1
"""Warn when the caches filled (first eviction) later than this share into the window."""
STABLE_STEP = 0.25
"""Two halves agree when their recommendations differ by at most one table step."""
MEASURED_AGAINST = {
    "access-replay": "simulator re-runs of the same requests (workload sweep)",
    "access-replay-rerouted": "simulator re-runs of the same requests (workload sweep)",
    "refault-corrected": "simulator re-runs (worst case of the workload sweep; no access "
    "stream, so near a capacity cliff it can be many points low)",
}
"""Where each method's error range was measured on the simulator's data (docs/analytics.md)."""
MEASURED_ON_REAL_ENGINES = (
    "real vLLM engines re-run at 1.5x and 2x the KV blocks (one engine, two behind a static "
    "split, two behind kvscope route; docs/benchmarks.md)"
)
"""Where the access replay's error range was measured for real engines' data."""
_TREND_UNITS = ((2 * 86400, 86400, "day"), (2 * 3600, 3600, "hour"), (0, 300, "5 minutes"))


def timing(rows: list[dict[str, Any]]) -> RequestTiming:
    """`report_request_timing` rows of the roles that prefill, summed."""
    served = [r for r in rows if r["role"] != "decode"]
    requests = sum(int(r["requests"] or 0) for r in served)
    timed = sum(int(r["timed_requests"] or 0) for r in served)
    uncached = sum(int(r["uncached_tokens"] or 0) for r in served)
    prefill_s = sum(float(r["prefill_s"] or 0.0) for r in served)

    def mean_ms(column: str) -> float | None:
        weighted = [(float(r[column]), int(r["requests"])) for r in served if r[column] is not None]
        total = sum(n for _, n in weighted)
        return 1000 * sum(v * n for v, n in weighted) / total if total else None

    return RequestTiming(
        requests=requests,
        timed_requests=timed,
        prefill_s_per_token=prefill_s / uncached if uncached and prefill_s > 0 else None,
        ttft_mean_ms=mean_ms("ttft_mean_s"),
        # one row per role that prefills: usually one; more are weighted like the mean
        ttft_p50_ms=mean_ms("ttft_p50_s"),
    )


def bytes_per_block(
    params: ReportParams, rows: list[dict[str, Any]], block_size: int
) -> tuple[int | None, str]:
    """KV bytes of a block and where they come from (see the module docstring)."""
    if params.kv_bytes_per_token and block_size:
        return params.kv_bytes_per_token * block_size, "model-config"
    moved = sum(int(r["block_bytes"] or 0) for r in rows)
    blocks = sum(int(r["blocks"] or 0) for r in rows)
    if moved and blocks:
        return round(moved / blocks), "kv-transfers"
    return None, "none"


def planner(
    capacity: CapacityFigures,
    params: ReportParams,
    timing_rows: list[dict[str, Any]],
    requests: int,
    prefilling: list[InstanceInfo] | None = None,
) -> PlannerFigures:
    """Every point of the capacity curve (and the recommended one) in a planner's units.

    `prefilling`: the instances the curve adds capacity to; each gets its own share of its
    own blocks in its own block size (a mixed fleet's instances need different GiB)."""
    per_block, source = bytes_per_block(params, timing_rows, capacity.block_size)
    measured = timing(timing_rows)
    rate = params.prefill_tokens_per_gpu_s
    rate_source = "flag" if rate else "none"
    if rate is None and measured.prefill_s_per_token:
        rate, rate_source = 1.0 / measured.prefill_s_per_token, "measured"

    def row(point: WhatIfPoint) -> PlannerRow:
        instances = max(capacity.instances, 1)
        gib = None if per_block is None else point.extra_blocks * per_block / GIB
        each = (
            None
            if gib is None
            else _gib_each(point.fraction, prefilling or [], per_block, capacity.block_size)
            or [gib / instances] * instances
        )
        per_instance = None if each is None else max(each)
        gpus = None
        if each is not None and params.gpu_gib:
            gpus = sum(math.ceil(g / params.gpu_gib - 1e-9) for g in each)
        saved_per_s = point.tokens_saved / capacity.window_s if capacity.window_s else 0.0
        gpu_hours = saved_per_s / rate if rate else None
        usd = params.usd_per_gpu_hour
        per_token = measured.prefill_s_per_token
        return PlannerRow(
            fraction=point.fraction,
            extra_blocks=point.extra_blocks,
            hit_rate=point.hit_rate,
            prefill_tokens_saved_per_s=saved_per_s,
            extra_gib_per_instance=per_instance,
            extra_gib=gib,
            gpus_added=gpus,
            prefill_gpu_hours_saved_per_hour=gpu_hours,
            net_gpus=None if gpus is None or gpu_hours is None else gpu_hours - gpus,
            usd_per_hour_added=None if gpus is None or usd is None else gpus * usd,
            usd_per_hour_saved=None if gpu_hours is None or usd is None else gpu_hours * usd,
            ttft_saved_ms=None
            if per_token is None or not requests
            else 1000 * point.tokens_saved / requests * per_token,
            extra_gib_per_instance_least=None if each is None else min(each),
        )

    chosen = next((p for p in capacity.curve if p.fraction == capacity.fraction_for_target), None)
    return PlannerFigures(
        bytes_per_block=per_block,
        bytes_source=source,
        gpu_gib=params.gpu_gib,
        usd_per_gpu_hour=params.usd_per_gpu_hour,
        prefill_tokens_per_gpu_s=rate,
        prefill_rate_source=rate_source,
        timing=measured,
        rows=[row(p) for p in capacity.curve],
        recommended=None if chosen is None else row(chosen),
    )


def _gib_each(
    fraction: float, instances: list[InstanceInfo], per_block: int | None, block_size: int
) -> list[float]:
    """Each instance's extra GiB at `fraction` more of its own blocks, the bytes of a block
    scaled to its own block size (`per_block` is for `block_size`); [] when unknown."""
    if per_block is None or not block_size or not instances:
        return []
    per_token = per_block / block_size
    return [
        math.floor(i.capacity_blocks * fraction) * i.block_size * per_token / GIB
        for i in instances
        if i.capacity_blocks and i.block_size
    ]


def warm_up_s(
    first_evictions: list[datetime | None], since: datetime, until: datetime
) -> float | None:
    """Seconds from `since` until every instance had evicted once, at most to `until`
    (None: one never did)."""
    if not first_evictions or any(t is None for t in first_evictions):
        return None
    latest = max(t for t in first_evictions if t)
    return max(0.0, (min(latest, until) - since).total_seconds())


def uncertainty(
    capacity: CapacityFigures,
    since: datetime,
    warm_up: float | None,
    halves: list[HalfFigures],
    resolution_s: float = 0.0,
) -> Uncertainty:
    """The method's error and where it was measured, and warnings about the window.

    `warm_up` is known to `resolution_s` (the end of the churn bucket with the first
    eviction): warm-up is called late only when even the bucket's start is."""
    window_s = capacity.window_s
    warnings = []
    if window_s < SHORT_WINDOW_S:
        warnings.append(
            f"The window is short ({_span(window_s)}): it holds no daily pattern; base a "
            "purchase on a day or more of data."
        )
    if warm_up is None:
        warnings.append(
            "Some cache never filled (no eviction in the window): the whole window is "
            "warm-up, and more memory cannot be judged from it."
        )
    elif warm_up - resolution_s > WARM_UP_SHARE * window_s:
        warnings.append(
            f"The caches filled only {_span(warm_up)} into the window (first eviction): that "
            "warm-up lowers today's hit rate; a window starting later measures the steady state."
        )
    stable = None
    if len(halves) == 2 and all(h.hit_rate is not None for h in halves):
        first, second = (h.fraction_for_target for h in halves)
        stable = (first is None and second is None) or (
            first is not None and second is not None and abs(first - second) <= STABLE_STEP
        )
        if not stable:
            warnings.append(
                "The recommendation moves with the window: the first half needs "
                f"{extra_share(first)}, the second {extra_share(second)}."
            )
    return Uncertainty(
        method=capacity.method,
        error_pp=capacity.error_pp,
        measured_against=measured_against(capacity),
        window_s=window_s,
        short_window=window_s < SHORT_WINDOW_S,
        warm_up_s=warm_up,
        halves=halves,
        stable=stable,
        warnings=warnings,
    )


def measured_against(capacity: CapacityFigures) -> str:
    """Where the error range the capacity what-if states was measured."""
    if capacity.error_basis == "real-engines":
        return MEASURED_ON_REAL_ENGINES
    return MEASURED_AGAINST.get(capacity.method, "not measured")


def fraction_range(
    curve: list[WhatIfPoint], target: float, error_pp: float
) -> tuple[float | None, float | None]:
    """The extra capacity the target needs if the predictions are `error_pp` points high or
    low: (the least, the most; None: none on the curve)."""
    error = error_pp / 100

    def first(shift: float) -> float | None:
        return next((p.fraction for p in curve if p.hit_rate + shift >= target), None)

    return first(error), first(-error)


def trend(rows: list[dict[str, Any]], since: datetime, until: datetime) -> Trend:
    """`report_trend` rows (asked with `trend_bucket(...)`'s seconds) as one point per bucket."""
    bucket_s, unit = trend_bucket(since, until)
    sums: dict[datetime, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for r in rows:
        cell = sums[r["bucket"]]
        offset = 2 if r["role"] == "decode" else 0
        cell[offset] += int(r["prefix_queries"])
        cell[offset + 1] += int(r["prefix_hits"])
        if r["role"] != "decode":
            cell[4] += int(r["requests"])
            cell[5] += int(r["prompt_tokens"])
    points = [
        TrendPoint(
            t=t if t.tzinfo else t.replace(tzinfo=since.tzinfo),
            requests=c[4],
            prompt_tokens=c[5],
            hit_rate=c[1] / c[0] if c[0] else None,
            decode_hit_rate=c[3] / c[2] if c[2] else None,
        )
        for t, c in sorted(sums.items())
    ]
    return Trend(bucket_s=bucket_s, unit=unit, points=points)


def trend_bucket(since: datetime, until: datetime) -> tuple[int, str]:
    """Days for windows of two days or more, hours from two hours, else 5 minutes."""
    span = (until - since).total_seconds()
    return next((b, unit) for least, b, unit in _TREND_UNITS if span >= least)


def halves_of(since: datetime, until: datetime) -> list[tuple[datetime, datetime]]:
    """The window's two halves."""
    middle = since + (until - since) / 2
    return [(since, middle), (middle, until)]


def _span(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def extra_share(value: float | None) -> str:
    """An extra-capacity share as `+60%`; None (no point on the curve) in words."""
    return "more than the curve holds" if value is None else f"+{value:.0%}"

"""A hand-made `Report` (no database) for the rendering tests."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from kvscope.analytics.report import advice, model, planner


def build_sample_report() -> model.Report:
    """A plausible small fleet: two prefill, two decode instances, one slow pair."""
    start = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
    times = [start + timedelta(seconds=5 * i) for i in range(24)]
    full = model.Completeness(1.0, 8)
    names = [
        ("prefill-0", "prefill"),
        ("prefill-1", "prefill"),
        ("decode-0", "decode"),
        ("decode-1", "decode"),
    ]
    instances = [
        model.InstanceFigures(
            instance=name,
            role=role,
            hit_rate=0.4 + 0.05 * k,
            usage=[model.TimePoint(t, min(1.0, 0.2 + 0.04 * i)) for i, t in enumerate(times)],
            residency_s=[
                model.Bucket(0.1 * 2**j, 0.1 * 2 ** (j + 1), 50 - 5 * j) for j in range(8)
            ],
            still_resident=512,
            churn=[
                model.ChurnPoint(t, 80 + int(20 * math.sin(i)), 60 + 3 * i)
                for i, t in enumerate(times)
            ],
            churn_ratio=0.7 + 0.05 * k,
            completeness=model.Completeness(1.0 - 0.001 * k, 2, k),
        )
        for k, (name, role) in enumerate(names)
    ]
    curve = [
        model.WhatIfPoint(
            f / 20,
            2048 * f // 20,
            0.45 + 0.4 * (1 - math.exp(-f / 8)),
            int(90000 * (1 - math.exp(-f / 8))),
        )
        for f in range(41)
    ]
    knee_at = advice.knee(curve)
    text = advice.recommendation(0.45, curve, 0.7, knee_at)
    capacity = model.CapacityFigures(
        0.45,
        curve,
        0.7,
        advice.fraction_for_target(curve, 0.7),
        knee_at,
        text,
        full,
        method="access-replay",
        error_pp=0.5,
        window_s=115.0,
        block_size=16,
        instances=4,
    )
    routing = model.RoutingFigures(
        [
            model.DuplicationRow("tiny-llama", "decode", 300, 100, 1 / 3),
            model.DuplicationRow("tiny-llama", "prefill", 200, 50, 0.25),
        ],
        10000,
        1200,
        19200,
        0.12,
        full,
        levers=model.LeverFigures(0.249, 0.5, 0.18, 0.31, "fixed"),
    )
    pairs = sorted(
        [
            model.PairLatency(
                src,
                dst,
                100,
                12.0 + 30 * (src == "prefill-1" and dst == "decode-0"),
                25.0 + 150 * (src == "prefill-1" and dst == "decode-0"),
                200.0,
                4.2,
                40 * (src == "prefill-1" and dst == "decode-0"),
            )
            for src in ("prefill-0", "prefill-1")
            for dst in ("decode-0", "decode-1")
        ],
        key=lambda p: -p.p99_ms,
    )
    transfers = model.TransferFigures(
        100.0,
        pairs,
        [
            model.LatencyPoint(p.src, p.dst, t, p.p50_ms + i % 3, p.p99_ms - 8 * (i % 5), 4)
            for p in pairs
            for i, t in enumerate(times)
        ],
        400,
        40,
        full,
    )
    fleet = model.FleetSummary(
        [model.InstanceInfo(n, r, "tiny-llama", 512, 16) for n, r in names],
        ["tiny-llama"],
        {"prefill": 2, "decode": 2},
        times[0],
        times[-1],
        {"kv_block_events": 20000, "engine_stats": 96, "requests": 400, "kv_transfers": 400},
        0.45,
        full,
        requests=400,
        prompt_tokens=160000,
    )
    params = model.ReportParams(
        None,
        None,
        None,
        0.7,
        100.0,
        131072,
        80.0,
        prefill_tokens_per_gpu_s=5000.0,
        usd_per_gpu_hour=2.5,
    )
    timing_rows = [
        {
            "role": role,
            "requests": 400,
            "timed_requests": 400 if role == "prefill" else 0,
            "prefill_s": 12.0 if role == "prefill" else 0.0,
            "uncached_tokens": 96000 if role == "prefill" else 0,
            "ttft_mean_s": 0.08,
            "ttft_p50_s": 0.06,
            "block_bytes": 0,
            "blocks": 0,
        }
        for role in ("decode", "prefill")
    ]
    plan = planner.planner(capacity, params, timing_rows, fleet.requests)
    halves = [
        model.HalfFigures(a, b, 0.44 + 0.02 * k, 0.5 + 0.25 * k)
        for k, (a, b) in enumerate(planner.halves_of(times[0], times[-1]))
    ]
    trend_rows = [
        {
            "bucket": t,
            "role": role,
            "prefix_queries": 4000,
            "prefix_hits": 1600 + 40 * i + 400 * (role == "decode"),
            "requests": 20,
            "prompt_tokens": 4000,
        }
        for i, t in enumerate(times[::6])
        for role in ("prefill", "decode")
    ]
    return model.Report(
        generated_at=start + timedelta(minutes=5),
        params=params,
        since=times[0],
        until=times[-1],
        bucket_s=60,
        usage_bucket_s=5,
        fleet=fleet,
        instances=instances,
        capacity=capacity,
        routing=routing,
        transfers=transfers,
        findings=advice.findings(fleet, instances, text, routing, transfers),
        planner=plan,
        uncertainty=planner.uncertainty(capacity, times[0], 30.0, halves),
        trend=planner.trend(trend_rows, times[0], times[-1]),
    )


@pytest.fixture
def sample_report() -> model.Report:
    """The hand-made report."""
    return build_sample_report()

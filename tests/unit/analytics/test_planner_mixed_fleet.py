"""Capacity in a planner's units on fleets whose instances differ.

The recommendation said "+114 blocks fleet-wide" while counting only the 2 instances of 5
that prefill, and one "GiB per instance" for instances with different block sizes and
capacities (the mean, which fits none of them)."""

from __future__ import annotations

import math

import pytest
from kvscope.analytics.report import advice, planner
from kvscope.analytics.report.model import (
    CapacityFigures,
    Completeness,
    InstanceInfo,
    ReportParams,
    WhatIfPoint,
)
from kvscope.analytics.report.sizing import GIB

PER_TOKEN = 128 * 1024


def _capacity(instances: list[InstanceInfo], fraction: float) -> CapacityFigures:
    extra = sum(math.floor(i.capacity_blocks * fraction) for i in instances)
    curve = [WhatIfPoint(0.0, 0, 0.4, 0), WhatIfPoint(fraction, extra, 0.8, 5000)]
    return CapacityFigures(
        0.4, curve, 0.7, fraction, None, "", Completeness(1.0, 1), window_s=100.0,
        block_size=max(i.block_size for i in instances), instances=len(instances),
    )  # fmt: skip


@pytest.mark.parametrize(
    "shape",
    [
        [(1000, 16)],
        [(1000, 16), (1000, 16)],
        [(1000, 16), (4000, 16)],
        [(2000, 16), (2000, 32), (500, 64)],
    ],
)
@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_each_instance_gets_its_own_gib_and_whole_gpus(
    shape: list[tuple[int, int]], fraction: float
) -> None:
    instances = [InstanceInfo(f"p{k}", "prefill", "m", c, b) for k, (c, b) in enumerate(shape)]
    capacity = _capacity(instances, fraction)
    params = ReportParams(None, None, None, 0.7, 50.0, kv_bytes_per_token=PER_TOKEN, gpu_gib=0.5)
    plan = planner.planner(capacity, params, [], 100, instances)
    row = plan.rows[-1]
    each = [math.floor(c * fraction) * b * PER_TOKEN / GIB for c, b in shape]
    assert row.extra_gib_per_instance == pytest.approx(max(each))
    assert row.extra_gib_per_instance_least == pytest.approx(min(each))
    assert row.gpus_added == sum(math.ceil(g / 0.5 - 1e-9) for g in each)

    text = advice.recommendation(0.4, capacity.curve, 0.7, None, planner=plan, instances=len(shape))
    assert "fleet-wide" not in text
    over = "on the one instance" if len(shape) == 1 else f"over the {len(shape)} instances"
    assert over in text
    spread = f"{min(each):.2f}–{max(each):.2f}" if f"{min(each):.2f}" != f"{max(each):.2f}" else ""
    assert (spread in text) if spread else f"{max(each):.2f} GiB per instance" in text

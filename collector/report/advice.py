"""Turn figures into advice: the capacity recommendation and the report's key findings.

Only arithmetic on figures the queries returned; no SQL here.
"""

from __future__ import annotations

import itertools

from kvscope.collector.report.layout import pct
from kvscope.collector.report.model import (
    FleetSummary,
    InstanceFigures,
    RoutingFigures,
    TransferFigures,
    WhatIfPoint,
)

KNEE_FRACTION = 0.1
"""A step on the curve is 'diminishing' when its gain per block falls below this fraction of
the average gain per block from zero to there."""


def blocks_for_target(curve: list[WhatIfPoint], target: float) -> int | None:
    """The fewest extra blocks whose predicted hit rate reaches `target` (None: never)."""
    for point in curve:
        if point.hit_rate >= target:
            return point.extra_blocks
    return None


def knee(curve: list[WhatIfPoint]) -> int | None:
    """The point of diminishing returns on the what-if curve (None: curve too short or flat).

    The first point after which the marginal gain per extra block drops below
    `KNEE_FRACTION` of the average gain per block up to that point.
    """
    if len(curve) < 3:
        return None
    base = curve[0]
    for here, after in itertools.pairwise(curve[1:]):
        average = (here.hit_rate - base.hit_rate) / max(here.extra_blocks - base.extra_blocks, 1)
        marginal = (after.hit_rate - here.hit_rate) / max(after.extra_blocks - here.extra_blocks, 1)
        if average > 0 and marginal < KNEE_FRACTION * average:
            return here.extra_blocks
    return None


def recommendation(
    baseline: float | None, curve: list[WhatIfPoint], target: float, knee_at: int | None
) -> str:
    """One or two plain sentences saying how much KV capacity to add."""
    if baseline is None or not curve:
        return (
            "Not enough data for a capacity recommendation (no prefix-cache queries or refaults)."
        )
    if baseline >= target:
        text = f"The fleet already reaches the target hit rate ({pct(baseline)} ≥ {pct(target)})."
    else:
        needed = blocks_for_target(curve, target)
        if needed is None:
            best = curve[-1]
            text = (
                f"No capacity on the curve reaches {pct(target)}: at +{best.extra_blocks:,} blocks "
                f"per instance the predicted hit rate is {pct(best.hit_rate)}; the rest of the "
                "misses are first-time prefixes that only routing or a longer-lived cache can save."
            )
        else:
            point = next(p for p in curve if p.extra_blocks == needed)
            text = (
                f"Add {needed:,} KV blocks per instance to reach the {pct(target)} target hit "
                f"rate (now {pct(baseline)}), saving {point.tokens_saved:,} prefill tokens in this "
                "window."
            )
    if knee_at is not None:
        text += f" Beyond +{knee_at:,} blocks per instance, extra capacity adds little."
    return text


def findings(
    fleet: FleetSummary,
    instances: list[InstanceFigures],
    capacity_text: str,
    routing: RoutingFigures,
    transfers: TransferFigures,
) -> list[str]:
    """The three most important findings, most important first."""
    items: list[str] = []
    if transfers.pairs and transfers.breaches:
        worst = transfers.pairs[0]
        items.append(
            f"KV transfers {worst.src} → {worst.dst} are the slowest pair: p99 "
            f"{worst.p99_ms:.0f} ms against an SLO of {transfers.slo_ms:g} ms "
            f"({transfers.breaches:,} of {transfers.transfers:,} transfers over the SLO)."
        )
    items.append(capacity_text)
    if routing.routing_hit_rate_gain:
        items.append(
            f"A prefix-aware router could add {pct(routing.routing_hit_rate_gain)} hit rate: "
            f"{routing.routable_stores:,} of {routing.total_stores:,} block stores were already "
            f"resident on another instance ({pct(routing.duplication)} of resident blocks are "
            "duplicated)."
        )
    churning = [f for f in instances if f.churn_ratio is not None]
    if churning:
        top = max(churning, key=lambda f: f.churn_ratio or 0.0)
        items.append(
            f"{top.instance} churns most: {pct(top.churn_ratio)} of stored blocks were evicted "
            f"(hit rate {pct(top.hit_rate)})."
        )
    lowest = min(
        [fleet.completeness, routing.completeness, transfers.completeness], key=lambda c: c.share
    )
    if lowest.share < 0.99:
        items.insert(0, f"Data is incomplete: {lowest.label}; figures undercount.")
    return items[:3]

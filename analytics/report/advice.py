"""Turn figures into advice: the capacity recommendation and the report's key findings.

Only arithmetic on figures the queries returned; no SQL here.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from kvscope.analytics.report.layout import (
    gib_per_instance,
    no_gain,
    pct,
    points,
    router_text,
)
from kvscope.analytics.report.model import (
    FleetSummary,
    InstanceFigures,
    PlannerFigures,
    RoutingFigures,
    TransferFigures,
    WhatIfPoint,
)
from kvscope.analytics.report.planner import extra_share, fraction_range

KNEE_SHARE = 0.1
"""A step on the curve is 'diminishing' when its gain per unit of extra capacity falls below
this share of the average gain per unit from zero to there."""


def fraction_for_target(curve: list[WhatIfPoint], target: float) -> float | None:
    """The smallest extra-capacity fraction whose predicted hit rate reaches `target`."""
    for point in curve:
        if point.hit_rate >= target:
            return point.fraction
    return None


def knee(curve: list[WhatIfPoint]) -> float | None:
    """The point of diminishing returns on the what-if curve (None: too short or still steep).

    The first point after which the marginal gain per unit of extra capacity drops below
    `KNEE_SHARE` of the average gain per unit up to that point.
    """
    if len(curve) < 3:
        return None
    base = curve[0]
    for here, after in itertools.pairwise(curve[1:]):
        average = (here.hit_rate - base.hit_rate) / max(here.fraction - base.fraction, 1e-9)
        marginal = (after.hit_rate - here.hit_rate) / max(after.fraction - here.fraction, 1e-9)
        if average > 0 and marginal < KNEE_SHARE * average:
            return here.fraction
    return None


def _capacity(point: WhatIfPoint, planner: PlannerFigures | None, instances: int) -> str:
    """The extra capacity of `point` in the largest units known: blocks, GiB, whole GPUs."""
    row = (
        None
        if planner is None
        else next((r for r in planner.rows if r.fraction == point.fraction), None)
    )
    over = {0: "fleet-wide", 1: "on the one instance that prefills"}.get(
        instances, f"over the {instances} instances that prefill"
    )
    units = [f"{point.extra_blocks:+,} blocks {over}"]
    if row is not None and row.extra_gib_per_instance is not None:
        units.append(f"{gib_per_instance(row)} GiB per instance")
    if row is not None and row.gpus_added is not None and planner is not None:
        units.append(f"{row.gpus_added} GPUs of {planner.gpu_gib:g} GiB")
    return f"{point.fraction:.0%} more KV capacity per instance ({', '.join(units)})"


def _payoff(point: WhatIfPoint, planner: PlannerFigures | None) -> str:
    """What the capacity of `point` saves, in the planner's units when known."""
    row = (
        None
        if planner is None
        else next((r for r in planner.rows if r.fraction == point.fraction), None)
    )
    text = f"it would have saved {point.tokens_saved:,} prefill tokens in this window"
    if row is None:
        return text
    if row.prefill_gpu_hours_saved_per_hour is not None:
        text += f" ({row.prefill_gpu_hours_saved_per_hour:.2f} GPU-hours of prefill per hour"
        if row.gpus_added is not None:
            text += f" against {row.gpus_added} GPUs added"
        text += ")"
    if row.ttft_saved_ms is not None:
        text += f" and {row.ttft_saved_ms:.1f} ms of prefill per request (TTFT)"
    return text


def recommendation(
    baseline: float | None,
    curve: list[WhatIfPoint],
    target: float,
    knee_at: float | None,
    error_pp: float | None = None,
    *,
    planner: PlannerFigures | None = None,
    warnings: Sequence[str] = (),
    instances: int = 0,
) -> str:
    """A few plain sentences saying how much KV capacity to add, in the planner's units when
    known, with the range the curve's error allows and the window's warnings. `instances`:
    how many instances the curve's blocks are spread over (the ones that prefill)."""
    if baseline is None or not curve:
        return "Not enough data for a capacity recommendation (no prefix-cache queries)."
    if baseline >= target:
        text = f"The fleet already reaches the target hit rate ({pct(baseline)} ≥ {pct(target)})."
    else:
        needed = fraction_for_target(curve, target)
        if needed is None:
            best = curve[-1]
            text = (
                f"No capacity on the curve reaches the {pct(target)} target: with "
                f"{_capacity(best, planner, instances)} the predicted hit rate is "
                f"{pct(best.hit_rate)} (now {pct(baseline)}); the remaining misses are "
                "first-time prefixes that only routing can save."
            )
        else:
            point = next(p for p in curve if p.fraction == needed)
            text = (
                f"Add {_capacity(point, planner, instances)} to reach the {pct(target)} target "
                f"hit rate (now {pct(baseline)}); {_payoff(point, planner)}."
            )
    if knee_at is not None:
        text += f" Beyond +{knee_at:.0%} capacity, more KV memory adds little hit rate."
    if error_pp is not None and baseline < target:
        least, most = fraction_range(curve, target, error_pp)
        text += f" Predicted hit rates are within ±{error_pp:g} points, so the target needs "
        text += (
            f"{extra_share(least)} either way."
            if least == most
            else f"{extra_share(least)} to {extra_share(most)}."
        )
    return " ".join([text, *warnings])


def findings(
    fleet: FleetSummary,
    instances: list[InstanceFigures],
    capacity_text: str,
    routing: RoutingFigures,
    transfers: TransferFigures,
    min_transfers: int = 20,
) -> list[str]:
    """The three most important findings, most important first. A transfer pair needs
    `min_transfers` transfers to be judged; fewer are said to be too few."""
    items: list[str] = []
    judged = [p for p in transfers.pairs if p.transfers >= min_transfers]
    if judged and any(p.breaches for p in judged):
        worst = judged[0]
        items.append(
            f"KV transfers {worst.src} → {worst.dst} are the slowest pair: p99 "
            f"{worst.p99_ms:.0f} ms against an SLO of {transfers.slo_ms:g} ms "
            f"({worst.breaches:,} of its {worst.transfers:,} transfers over the SLO)."
        )
    elif transfers.breaches:
        items.append(
            f"{transfers.breaches:,} KV transfers were over the {transfers.slo_ms:g} ms SLO, "
            f"but no pair has {min_transfers} transfers: too few to judge a pair."
        )
    items.append(capacity_text)
    lv = routing.levers
    if lv is not None and not no_gain(lv.router):
        items.append(
            f"Routing or memory: {router_text(lv.router_affinity)} alone would add "
            f"{points(lv.router)} of hit rate; "
            f"+{lv.memory_fraction:.0%} KV memory alone {points(lv.memory)}; both "
            f"{points(lv.both)} (replayed from the access stream)."
        )
    elif lv is None and routing.hit_rate_gain:
        items.append(
            f"A prefix-aware router could add at most {points(routing.hit_rate_gain)} of hit "
            f"rate: {routing.opportunity_blocks:,} of {routing.stores:,} block stores were "
            "already resident on another instance of the same model and role (an upper "
            "bound from the KV events; an access stream would replay it)."
        )
    churning = [f for f in instances if f.churn_ratio]  # evicting at all
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

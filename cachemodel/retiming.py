"""When a re-routed request would have been looked up on the source a replay sends it to.

A replay that routes a request elsewhere than where it ran cannot keep its observed lookup
time: that was the old source's, and whether a request arriving just after it sees its
blocks (and is routed to them) depends on when the new source looks it up. An engine
admits waiting requests at its steps, in arrival order. `StepClock` infers a source's
steps from the times its accesses were looked up and released: when they all lie on one
fixed grid of at least `MIN_STEP_US` (the simulator steps every `step_ms`, each engine at
its own phase), a re-routed request is looked up at the new source's first step at or
after its arrival; otherwise (a real engine steps whenever it has work) it keeps the wait
it had. Either way a moved request is not looked up before one that arrived earlier on
its new source. docs/analytics.md, "Levers from one model", has the agreement with re-runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MIN_STEP_US = 1_000
"""A grid finer than this (µs) is taken for timestamps that merely share a unit, not steps."""


class StepClock:
    """One source's step grid (if it has one) and the last lookup a replay gave it.

    `times_us`: when the source looked its requests up and released them; `arrivals_us`:
    when they arrived. The source steps on a grid when the former share one of at least
    `MIN_STEP_US` and some arrival falls off it (requests waited for a step; accesses that
    are looked up as they arrive have no steps to wait for)."""

    def __init__(self, times_us: Iterable[int], arrivals_us: Iterable[int]) -> None:
        first: int | None = None
        step = 0
        for t in times_us:
            if first is None:
                first = t
            step = math.gcd(step, t - first)
        phase = first % step if step >= MIN_STEP_US and first is not None else 0
        waited = step >= MIN_STEP_US and any((t - phase) % step for t in arrivals_us)
        self.step_us = step if waited else 0
        """The grid's period, µs (0: no grid)."""
        self.phase_us = phase if waited else 0
        self.last_lookup_us = 0

    def lookup(self, arrival_us: int, wait_us: int, moved: bool) -> int:
        """When a request arriving at `arrival_us` is looked up here. Where it ran: its
        observed time, `arrival_us + wait_us`. `moved` here from another source: the first
        step at or after its arrival (on a grid) or its observed wait after arrival (no
        grid), but not before the replay's previous lookup on this source."""
        at = arrival_us + wait_us
        if moved:
            if self.step_us:
                steps = -((self.phase_us - arrival_us) // self.step_us)  # rounded up
                at = self.phase_us + steps * self.step_us
            at = max(at, self.last_lookup_us)
        self.last_lookup_us = max(at, self.last_lookup_us)
        return at

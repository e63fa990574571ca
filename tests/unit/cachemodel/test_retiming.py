"""Where a re-routed request is looked up: the new source's next step on a grid, else its own
wait; never before a request that arrived earlier on the same source."""

from __future__ import annotations

import random

import pytest
from kvscope.cachemodel.retiming import StepClock


def _stepping(rng: random.Random, step: int, phase: int, n: int) -> tuple[list[int], list[int]]:
    """Arrivals at random µs, each looked up at the first step at or after it and freed
    some steps later (the simulator's engines)."""
    arrivals = sorted(rng.randrange(10**9) for _ in range(n))
    lookups = [phase + -(-(t - phase) // step) * step for t in arrivals]
    frees = [t + step * rng.randrange(1, 6) for t in lookups]
    return arrivals, lookups + frees


@pytest.mark.parametrize(
    ("step", "phase", "n"), [(20_000, 4_000, 50), (5_000, 0, 8), (1_000, 999, 200)]
)
def test_a_moved_request_waits_for_the_new_sources_next_step(step: int, phase: int, n: int) -> None:
    rng = random.Random(step + n)
    arrivals, times = _stepping(rng, step, phase, n)
    clock = StepClock(times, arrivals)
    assert (clock.step_us, clock.phase_us) == (step, phase)
    for t in sorted(rng.randrange(10**9) for _ in range(20)):
        at = clock.lookup(t, 7, moved=True)
        assert t <= at < t + step and (at - phase) % step == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_a_grid_a_moved_request_keeps_its_wait_behind_earlier_ones(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = sorted(rng.randrange(10**9) for _ in range(30))
    clock = StepClock([t + rng.randrange(1, 900) for t in arrivals], arrivals)
    assert clock.step_us == 0
    assert clock.lookup(1_000, 500, moved=False) == 1_500
    assert clock.lookup(1_100, 100, moved=True) == 1_500  # not before the earlier arrival
    assert clock.lookup(2_000, 300, moved=True) == 2_300


def test_accesses_looked_up_as_they_arrive_have_no_steps() -> None:
    """Times on a coarse grid with arrivals on it too (no request waited): no grid."""
    arrivals = [1_000 * k for k in range(0, 60, 3)]
    clock = StepClock([*arrivals, *(t + 12_000 for t in arrivals)], arrivals)
    assert clock.step_us == 0
    assert clock.lookup(4_500, 0, moved=True) == 4_500

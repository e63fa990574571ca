"""`Backoff`: jittered delays inside their bounds, growing to the maximum, reset, seeded."""

from __future__ import annotations

import random

import pytest
from kvscope.common.backoff import Backoff


@pytest.mark.parametrize(("initial", "maximum"), [(0.1, 1.0), (0.5, 30.0), (1.0, 1.0)])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_delays_stay_between_half_the_initial_and_the_doubling_ceiling(
    initial: float, maximum: float, seed: int
) -> None:
    backoff = Backoff(initial, maximum, random.Random(seed))
    for attempt in range(20):
        ceiling = min(maximum, initial * 2**attempt)
        assert initial / 2 <= backoff.next_delay() <= ceiling
    assert backoff.attempts == 20


def test_delays_grow_and_reset_starts_over() -> None:
    backoff = Backoff(0.1, 1.0, random.Random(3))
    delays = [backoff.next_delay() for _ in range(8)]
    assert max(delays[4:]) > 0.2
    backoff.reset()
    assert backoff.attempts == 0
    assert backoff.next_delay() <= 0.1


def test_a_seeded_generator_makes_the_delays_reproducible() -> None:
    def delays(seed: int) -> list[float]:
        backoff = Backoff(0.1, 5.0, random.Random(seed))
        return [backoff.next_delay() for _ in range(6)]

    assert delays(42) == delays(42)
    assert delays(42) != delays(43)


def test_default_jitter_differs_between_engines_that_seeded_random_alike() -> None:
    """vLLM seeds `random` with the same seed in every engine process: engines that lost
    the same broker must still not retry in lockstep."""
    delays = set()
    for _ in range(3):
        random.seed(0)
        delays.add(tuple(Backoff(1.0, 30.0).next_delay() for _ in range(4)))
    assert len(delays) == 3

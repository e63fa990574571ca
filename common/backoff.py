"""`Backoff`: exponential delays with jitter for retry loops (reconnects, re-inserts).

Jitter keeps many engines (or collectors) that lost the same broker from retrying in
lockstep. By default it draws from the OS's entropy, not from `random`'s global state,
which vLLM seeds with the same `seed` (0 by default) in every engine process: jitter from
there would be the same in every engine. Pass a seeded `random.Random` to make the delays
reproducible in tests.
"""

from __future__ import annotations

import random

_ENTROPY = random.SystemRandom()
"""Jitter source independent of `random.seed` (see above)."""


class Backoff:
    """Exponential backoff with jitter: delay ~ U(initial / 2, min(max, initial * 2**n))."""

    def __init__(
        self, initial_s: float, maximum_s: float, rng: random.Random | None = None
    ) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.attempts = 0
        self._uniform = (rng or _ENTROPY).uniform

    def next_delay(self) -> float:
        """The next delay; each call doubles the ceiling up to the maximum."""
        ceiling = min(self.maximum_s, self.initial_s * (2**self.attempts))
        self.attempts += 1
        return self._uniform(self.initial_s / 2, ceiling)

    def reset(self) -> None:
        """Back to the initial delay (after a success)."""
        self.attempts = 0

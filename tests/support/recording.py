"""A recording publisher and a settable clock for unit tests of engine-side timing.

`Recorder` is a recording sink standing in for Kafka (style: consumertest's sink);
`Clock` lets a test decide how much time passes between two calls.
"""

from __future__ import annotations

from typing import Any

from kvscope.publisher import Publisher


class Recorder(Publisher):
    """Keeps published bodies in memory, in order."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []

    def publish(self, body: Any, ts: float | None = None) -> None:
        """Keep the body."""
        self.bodies.append(body)

    def publish_raw(self, stream: str, raw: Any, ts: float | None, convert: Any) -> None:
        """Keep the converted body (the sender thread's conversion, done at once)."""
        self.bodies.append(convert(raw))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Nothing to stop."""


class Clock:
    """A clock the test sets: `clock.now += 0.5` is half a second passing."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

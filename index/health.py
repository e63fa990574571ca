"""`FeedStatus`: whether an index's Kafka feed is reading and caught up, and since when.

`kvscope index` reports it on /healthz, /sources and /metrics and sets `ScoreResult.ready`
from it; the router's in-process index decides from it whether to trust its scores. No
Kafka import here: the HTTP layer reads the status without pulling the client in.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class FeedStatus:
    """One look at a feed: connected or not since `since`, caught up, the last error."""

    connected: bool = True
    caught_up: bool = True
    since: float = 0.0
    """Wall-clock seconds when `connected` last changed (0: never known)."""
    last_error: str = ""
    """The newest error of the connection ("" when none yet)."""

    @property
    def ready(self) -> bool:
        """Whether answers are current: reading, and read up to the topic's end."""
        return self.connected and self.caught_up

    def reason(self) -> str | None:
        """Why answers are not current (one line), or None when they are."""
        if not self.connected and not self.last_error:
            return "connecting to Kafka"
        if not self.connected:
            why = f" ({self.last_error})" if self.last_error else ""
            return f"not connected to Kafka for {self.for_s():.1f} s{why}; reconnecting"
        if not self.caught_up:
            return "reading the topic, not caught up with its end yet"
        return None

    def for_s(self, now: float | None = None) -> float:
        """Seconds in the present connection state."""
        if not self.since:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - self.since)

    def as_json(self) -> dict[str, Any]:
        """The status as /healthz and /sources show it."""
        return {
            "ok": self.ready,
            "caught_up": self.caught_up,
            "connected": self.connected,
            "since": round(self.since, 3),
            "last_error": self.last_error,
            "reason": self.reason(),
        }

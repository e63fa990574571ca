"""Log throttling: one line per kind of repeated message, not one per occurrence.

A broker that is down makes aiokafka log the same connection ERROR several times a
second (~930 lines in 8 s were measured from one collector), and a bridge fed
undecodable frames warned once per frame. `RepeatFilter` lets the first record of each
(logger, level, message template) through, drops the repeats for `window_s`, and appends
how many it dropped to the next one it lets through. Per-record outcomes belong in
Prometheus counters; the log says that something is happening, once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

AIOKAFKA_LOGGERS = (
    "aiokafka",
    "aiokafka.client",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
)
"""aiokafka's loggers (filters apply per logger, not to its children)."""
MAX_KEYS = 1024
"""Message templates remembered at most (then the memory starts over)."""


class RepeatFilter(logging.Filter):
    """Pass the first record of each (logger, level, template) per window; count the rest."""

    def __init__(
        self,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        min_level: int = logging.WARNING,
    ) -> None:
        super().__init__()
        self.min_level = min_level
        """Records below this level always pass (start/stop lines are not repeats)."""
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True for a record to emit (annotated with the repeats dropped before it)."""
        if record.levelno < self.min_level:
            return True
        key = (record.name, record.levelno, record.msg)
        now = self.clock()
        since, dropped = self._seen.get(key, (None, 0))
        if since is not None and now - since < self.window_s:
            self._seen[key] = (since, dropped + 1)
            return False
        if len(self._seen) >= MAX_KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = (
                f"{record.msg} [{dropped} more like this in the last {self.window_s:.0f} s]"
            )
        return True


_installed: dict[str, RepeatFilter] = {}


def throttle(names: tuple[str, ...], window_s: float = 60.0) -> None:
    """Install one `RepeatFilter` on each named logger (once per logger name)."""
    for name in names:
        if name not in _installed:
            _installed[name] = RepeatFilter(window_s)
            logging.getLogger(name).addFilter(_installed[name])


def quiet_aiokafka(window_s: float = 60.0) -> None:
    """Throttle aiokafka's repeated connection errors while a broker is unreachable."""
    throttle(AIOKAFKA_LOGGERS, window_s)

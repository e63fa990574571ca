"""Publishing a simulated fleet at a real pace, for `kvscope demo --pace`.

The fleet simulator runs as fast as it can; `PacedSink` sits between it and the real sink
and holds each record back until its simulated time is due on the wall clock
(`pace` simulated seconds per wall second), so the records reach Kafka, the collector and
the live dashboard while they happen. `paced_start_ts` picks the simulated start time so
that no record's timestamp is ahead of the wall clock when it is published (the dashboard
and the named queries read up to now). `interrupts_stop` turns the first Ctrl-C (or
SIGTERM) into a request to stop publishing, so the demo can still store what it published
and write the report.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.schemas import AnyBody, Source
    from kvscope.simulator.fleet import Sink

log = logging.getLogger(__name__)

TAIL_S = 30.0
"""Simulated seconds the last requests may run after the last arrival (a margin)."""
REPORT_EVERY_S = 5.0
"""Wall seconds between two progress lines while publishing at a pace."""
TICK_S = 0.1
"""Longest single sleep while a record waits: how soon a stop request is seen."""


class PublishingStopped(Exception):
    """Raised out of the fleet's run by `PacedSink` once a stop was requested."""


def paced_start_ts(now: float, span_s: float, pace: float) -> float:
    """The simulated start time for a paced run of about `span_s` simulated seconds.

    At pace 1 it is `now`: records carry the wall-clock time of their publication. At a
    faster pace simulated time runs ahead of the wall clock, so the run starts in the past
    by the part of the span the wall clock will not cover, and its last records arrive at
    about now; no record is ever stamped later than the moment it is published.
    """
    return now - (span_s + TAIL_S) * (1.0 - 1.0 / pace) if pace > 1.0 else now


def clock_hms(seconds: float) -> str:
    """`seconds` as H:MM:SS (simulated time in progress lines)."""
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class PacedSink:
    """A fleet sink that releases each record when its simulated time is due.

    Record `ts` is published at wall time `wall_start + (ts - start_ts) / pace` (records
    come in simulated-time order). After `stop()` (safe from a signal handler: it only
    sets a flag, where a lock could deadlock the thread it interrupted) the next record
    raises `PublishingStopped` instead of being published, within `TICK_S`, so everything
    handed to `sink` was handed whole. Every `REPORT_EVERY_S` wall seconds
    `report(simulated_s, published)` is called.
    """

    def __init__(
        self,
        sink: Sink,
        pace: float,
        start_ts: float,
        report: Callable[[float, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < pace < math.inf:
            raise ValueError(f"pace must be a finite number > 0, got {pace}")
        self._sink = sink
        self._pace = pace
        self._start_ts = start_ts
        self._report = report
        self._clock = clock
        self._sleep = sleep
        self._wall_start = clock()
        self._next_report = self._wall_start + REPORT_EVERY_S
        self.stopped = False
        """Set by `stop()`: no record is published after it."""
        self.published = 0
        """Records handed to the sink so far."""
        self.simulated_s = 0.0
        """Simulated time (seconds from the start) of the last record published."""

    def stop(self) -> None:
        """Publish nothing more; the waiting (or next) record raises `PublishingStopped`."""
        self.stopped = True

    def __call__(self, source: Source, epoch: int, body: AnyBody, ts: float) -> None:
        due = self._wall_start + (ts - self._start_ts) / self._pace
        while not self.stopped:
            delay = due - self._clock()
            if delay <= 0:
                break
            self._sleep(min(delay, TICK_S))
        if self.stopped:
            raise PublishingStopped
        self._sink(source, epoch, body, ts)
        self.published += 1
        self.simulated_s = ts - self._start_ts
        if self._report is not None and self._clock() >= self._next_report:
            self._next_report = self._clock() + REPORT_EVERY_S
            self._report(self.simulated_s, self.published)


@contextmanager
def interrupts_stop(stop: Callable[[], None]) -> Iterator[None]:
    """While inside: the first SIGINT/SIGTERM calls `stop()`; a second one interrupts.

    Only the main thread can install signal handlers; elsewhere this does nothing (the
    caller's own Ctrl-C handling stays in force). A signal the process ignores (SIGINT of
    a job a shell started in the background) stays ignored. The previous handlers come
    back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    requested = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            raise KeyboardInterrupt
        requested = True
        stop()

    previous = {
        signum: signal.signal(signum, handler)
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)

"""`kvscope demo --pace`: the pacing sink on a virtual clock, the start time, and Ctrl-C.

The clock is virtual (a counter that `sleep` advances), so the checks are exact and take
no wall time; the signal test sends real SIGINTs to this process.
"""

from __future__ import annotations

import itertools
import os
import signal

import pytest
from kvscope.local.pacing import (
    REPORT_EVERY_S,
    TAIL_S,
    PacedSink,
    PublishingStopped,
    clock_hms,
    interrupts_stop,
    paced_start_ts,
)
from kvscope.schemas import EngineStats, Source

SOURCE = Source(instance="engine-0")
BODY = EngineStats(capacity_blocks=8, block_size=16, usage=0.5)


class VirtualClock:
    """Wall time that only `sleep` moves (starts at 1000 s)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def simulated_times(span_s: float, count: int) -> list[float]:
    """`count` record times spread over `span_s` simulated seconds, uneven on purpose."""
    return [span_s * (i / (count - 1)) ** 2 for i in range(count)]


@pytest.mark.parametrize("pace", [0.25, 1.0, 7.5, 600.0])
@pytest.mark.parametrize("span_s", [3.0, 720.0])
def test_each_record_leaves_when_due_and_not_before(pace: float, span_s: float) -> None:
    clock = VirtualClock()
    start_ts = 1_767_225_600.0
    published: list[tuple[float, float]] = []
    paced = PacedSink(
        lambda source, epoch, body, ts: published.append((clock.now, ts)),
        pace,
        start_ts,
        clock=clock,
        sleep=clock.sleep,
    )
    wall_start = clock.now
    times = simulated_times(span_s, 40)
    for t in times:
        paced(SOURCE, 1, BODY, start_ts + t)
    assert [ts for _, ts in published] == [start_ts + t for t in times]
    for wall, ts in published:
        assert wall == pytest.approx(wall_start + (ts - start_ts) / pace, abs=1e-6)
    assert clock.now - wall_start == pytest.approx(span_s / pace)
    assert paced.published == len(times)
    assert paced.simulated_s == pytest.approx(span_s)


def test_a_late_record_goes_out_at_once() -> None:
    """Records already due (the simulator fell behind) are not held back at all."""
    clock = VirtualClock()
    sent: list[float] = []
    paced = PacedSink(lambda *args: sent.append(args[3]), 1.0, 50.0, clock=clock, sleep=clock.sleep)
    clock.now += 10.0  # ten wall seconds pass before the first record
    for ts in (50.0, 55.0, 59.5):
        paced(SOURCE, 1, BODY, ts)
    assert sent == [50.0, 55.0, 59.5]
    assert clock.sleeps == []


@pytest.mark.parametrize("stop_after_sleeps", [1, 3, 20])
def test_stop_while_waiting_publishes_nothing_more(stop_after_sleeps: int) -> None:
    clock = VirtualClock()
    sent: list[float] = []
    paced = PacedSink(lambda *args: sent.append(args[3]), 1.0, 0.0, clock=clock)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == stop_after_sleeps:
            paced.stop()  # as the Ctrl-C handler does, in the middle of a wait

    paced._sleep = sleep
    paced(SOURCE, 1, BODY, 0.0)
    with pytest.raises(PublishingStopped):
        paced(SOURCE, 1, BODY, 60.0)
    with pytest.raises(PublishingStopped):
        paced(SOURCE, 1, BODY, 0.0)  # even one already due
    assert sent == [0.0]
    assert paced.published == 1
    assert len(clock.sleeps) == stop_after_sleeps, "the wait ended at the stop request"


def test_progress_is_reported_every_few_wall_seconds() -> None:
    clock = VirtualClock()
    reports: list[tuple[float, float, int]] = []
    paced = PacedSink(
        lambda *args: None,
        2.0,
        0.0,
        report=lambda simulated_s, published: reports.append((clock.now, simulated_s, published)),
        clock=clock,
        sleep=clock.sleep,
    )
    for second in range(61):  # one record per simulated second: 30 wall seconds at 2x
        paced(SOURCE, 1, BODY, float(second))
    walls = [wall for wall, _, _ in reports]
    assert len(reports) == int(30 // REPORT_EVERY_S)
    assert all(b - a >= REPORT_EVERY_S for a, b in itertools.pairwise(walls))
    assert [published for _, _, published in reports] == [
        int(simulated) + 1 for _, simulated, _ in reports
    ]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_pace_that_cannot_be_kept_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="pace"):
        PacedSink(lambda *args: None, bad, 0.0)


@pytest.mark.parametrize("pace", [0.5, 1.0, 2.0, 10.0, 1000.0])
@pytest.mark.parametrize("span_s", [60.0, 720.0, 1500.0])
def test_no_record_is_stamped_ahead_of_the_wall_clock(pace: float, span_s: float) -> None:
    """The dashboard reads up to now: every record, tail included, is stamped <= its
    publication time; at pace 1 (or slower) the stamps are the wall clock itself."""
    now = 1_767_225_600.0
    start = paced_start_ts(now, span_s, pace)
    for step in range(101):
        t = (span_s + TAIL_S) * step / 100  # simulated seconds since the start
        published_at = now + t / pace
        assert start + t <= published_at + 1e-6
        if pace <= 1.0:
            assert start + t == pytest.approx(now + t)
    last_at = now + (span_s + TAIL_S) / pace
    assert start + span_s + TAIL_S == pytest.approx(last_at), "the run ends at about now"


def test_first_signal_stops_second_interrupts_then_handlers_come_back() -> None:
    stops: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    with interrupts_stop(lambda: stops.append(1)):
        os.kill(os.getpid(), signal.SIGINT)
        assert stops == [1]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert stops == [1]
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_sigint_stays_ignored() -> None:
    """A job a shell started in the background ignores SIGINT; pacing must not revive it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        stops: list[int] = []
        with interrupts_stop(lambda: stops.append(1)):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)  # SIGTERM still asks to stop
        assert stops == [1]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00:00"), (59.9, "0:00:59"), (754, "0:12:34"), (3600, "1:00:00")]
)
def test_clock_hms(seconds: float, text: str) -> None:
    assert clock_hms(seconds) == text

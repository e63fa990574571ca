"""LogContinuity: a seq hole right after the records taken last is checked against the log once.

The real broker cannot be made, on demand, to hand the consumer a new log at its old
position before the group rejoins (the integration test in
tests/integration/collector/test_collector_broker_loss.py meets that race only in some
runs), so these tests drive the decision with records built in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition
from kvscope.collector.pipeline.continuity import LogContinuity
from kvscope.collector.pipeline.gaps import GapTracker
from kvscope.schemas import Source, encode
from support.collector_testkit import kv_envelopes

TP = TopicPartition("t", 0)


@dataclass(frozen=True)
class Record:
    """The two fields of an aiokafka ConsumerRecord the check reads."""

    offset: int
    value: bytes | None


def _log(epoch: int, records: int, seed: int = 0, instance: str = "a") -> list[Record]:
    envelopes = kv_envelopes(Source(instance=instance), epoch, records, seed=seed)
    return [Record(i, encode(e)) for i, e in enumerate(envelopes)]


def _taken(records: list[Record]) -> tuple[GapTracker, LogContinuity]:
    """A tracker and continuity that have taken `records` in order."""
    tracker = GapTracker()
    continuity = LogContinuity(tracker)
    envelopes = kv_envelopes(Source(instance="a"), 1, len(records))
    tracker.observe(TP.topic, TP.partition, [([r.offset for r in records], envelopes)])
    continuity.took(TP, records[-1])
    return tracker, continuity


@pytest.mark.parametrize("stored", [1, 7, 50])
def test_the_next_record_of_the_same_log_is_taken_without_a_check(stored: int) -> None:
    old = _log(1, stored + 5)
    _, continuity = _taken(old[:stored])
    assert continuity.check_before(TP, old[stored], stored) is None


@pytest.mark.parametrize(("stored", "new_log"), [(1, 3), (7, 20), (50, 200)])
def test_a_new_log_read_from_the_old_position_is_checked_against_the_record_taken_last(
    stored: int, new_log: int
) -> None:
    old = _log(1, stored)
    new = _log(2, new_log, seed=1)
    _, continuity = _taken(old)
    check = continuity.check_before(TP, new[stored], stored)
    assert check is not None
    assert check.offset == stored - 1
    assert check.matches(old[-1].value)
    assert not check.matches(new[stored - 1].value)


def test_a_hole_in_the_same_log_is_checked_once() -> None:
    old = _log(1, 12)
    _, continuity = _taken(old[:5])
    ahead = old[9]
    jumped = Record(5, ahead.value)  # seq 9 at offset 5: records 5-8 missing from the log
    check = continuity.check_before(TP, jumped, 5)
    assert check is not None and check.matches(old[4].value)
    continuity.forget(TP)  # as the collector does once the check passed
    assert continuity.check_before(TP, jumped, 5) is None


@pytest.mark.parametrize("gap", [(3, 4), (2, 5)])
def test_no_check_when_the_record_does_not_follow_the_one_taken_last(
    gap: tuple[int, int],
) -> None:
    """After a seek, or records taken elsewhere, the assignment check is the one that runs."""
    taken, offset = gap
    old = _log(1, 10)
    new = _log(2, 10, seed=1)
    _, continuity = _taken(old[:taken])
    assert continuity.check_before(TP, Record(offset, new[offset].value), offset) is None


@pytest.mark.parametrize("value", [None, b"", b"\xc1not msgpack"])
def test_records_without_an_identity_are_taken(value: bytes | None) -> None:
    old = _log(1, 4)
    _, continuity = _taken(old)
    assert continuity.check_before(TP, Record(4, value), 4) is None


def test_forgotten_partitions_are_not_checked_and_a_loss_is_reported_once() -> None:
    old = _log(1, 4)
    new = _log(2, 10, seed=1)
    _, continuity = _taken(old)
    continuity.forget(TP)
    assert continuity.check_before(TP, new[4], 4) is None
    assert continuity.first_report(TP, 3)
    assert not continuity.first_report(TP, 3)
    assert continuity.first_report(TP, 4)
    assert continuity.first_report(TopicPartition("t", 1), 3)

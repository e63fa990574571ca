"""Log continuity: whether a partition's next records continue the log its stored ones came from.

A broker that loses its log restarts offsets at 0. On assignment the collector re-reads the
last stored offset and compares (`LastStored`). But a consumer that keeps its assignment
across the broker's restart can fetch from its old position on a new log that has already
grown past it: the new log's records below that position would never be read, and the first
record it does read starts a seq hole. So when a partition's next record, continuing the
records taken before it, opens a seq hole, the collector first re-reads the record it took
last and compares its bytes: the same record means the hole is real (records missing from
the log itself) and reading goes on; another record means a new log, read from its start.
Each hole is checked once (a check that passes forgets the record taken last, so the
hole's record is taken without another), and each lost log is reported once per partition
and offset, whichever of the two detections sees it first.
"""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from kvscope.collector.pipeline.gaps import GapTracker
from kvscope.collector.pipeline.write import LastStored, record_identity


class LogContinuity:
    """Per partition: the record taken last; losses already reported."""

    def __init__(self, tracker: GapTracker) -> None:
        self._tracker = tracker
        self._last_taken: dict[TopicPartition, Any] = {}
        self._reported: set[tuple[TopicPartition, int]] = set()

    def took(self, tp: TopicPartition, record: Any) -> None:
        """`record` (an aiokafka record) is the last one taken from `tp` so far."""
        self._last_taken[tp] = record

    def check_before(self, tp: TopicPartition, record: Any, expected: int) -> LastStored | None:
        """The check to run before taking `record` from `tp`, or None to take it.

        A check is due when `record` directly follows the record taken last (offset
        `expected`) and opens a seq hole for its source.
        """
        last = self._last_taken.get(tp)
        if last is None or last.offset != expected - 1 or record.offset != expected:
            return None
        who = record_identity(record.value)
        if who is None:
            return None
        source, seq = who
        if not self._tracker.reveals_hole(tp.topic, tp.partition, source, seq):
            return None
        value = last.value or b""
        return LastStored(last.offset, None, value_size=len(value), prefix=value)

    def first_report(self, tp: TopicPartition, offset: int) -> bool:
        """True the first time a lost log is found for `tp` at stored `offset`."""
        key = (tp, offset)
        if key in self._reported:
            return False
        self._reported.add(key)
        return True

    def forget(self, tp: TopicPartition) -> None:
        """Nothing taken from `tp` so far needs checking again: it was revoked, its log
        replaced, or a check found its log holds the records taken."""
        self._last_taken.pop(tp, None)

"""What the collector keeps per owned Kafka partition, in one object.

One `PartitionState` per partition this member owns (the OpenTelemetry Kafka receiver's
`partition_worker.go` keeps one struct per partition the same way): it is made when the
partition is assigned and dropped, whole, when the partition is revoked. Rows waiting for
the next flush (`Buffer`) and polled records not yet taken are the flush's, not the
partition's: a revoke drops all of them at once (see `Collector._drop_pending`).
"""

from __future__ import annotations

import dataclasses
import logging

from aiokafka import TopicPartition
from kvscope.collector.pipeline.write import LastStored, Replay

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PartitionState:
    """One owned partition: where reading goes on, and what must be checked first."""

    expected: int | None = None
    """Next offset to take; None until the partition is positioned (its records are
    skipped until then: they were fetched before the seek)."""
    check: LastStored | None = None
    """The record the partition's first read must be (its last stored one, or the one
    taken last before a seq hole); another record there means a new log."""
    replay_after_check: Replay | None = None
    """A noted batch to re-read once `check` finds the stored record: skipping by offset
    is right only while the log is the one the rows came from."""
    replay: Replay | None = None
    """A noted batch being re-read: its offsets already stored are skipped."""
    seek_due: bool = False
    """The partition must be read again from `seek` before its next records are taken."""
    seek: int | None = None
    """Where to read again (with `seek_due`): None for a new log's first offset, else the
    record to check (`LogContinuity`)."""
    journal: int = 0
    """The latest `ingest_inserts` version written or found for the partition (a floor
    for the next flush id)."""

    def seek_to(self, offset: int | None) -> None:
        """Read the partition again from `offset` (None: the log's first offset)."""
        self.seek_due, self.seek = True, offset

    def restore(
        self, tp: TopicPartition, journal: int, last: LastStored | None, replay: Replay | None
    ) -> None:
        """Take what the stored tables say about `tp` on assignment: its journal floor and,
        when it has stored records, the last one to find again first and the noted batch
        (`replay`) to re-read once it is found."""
        self.journal = journal
        if last is None:
            return
        if replay is not None:
            log.info(
                "%s[%d]: re-reading offsets %d..%d once offset %d holds the record "
                "stored there, skipping %d already stored",
                tp.topic,
                tp.partition,
                replay.first_offset,
                replay.next_offset - 1,
                last.offset,
                len(replay.stored),
            )
            self.replay_after_check = replay
        self.check = last

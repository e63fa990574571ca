"""Sequence-gap detection: holes in `seq` per (source, epoch, stream) -> `stream_gaps`.

Publishers number records 0, 1, 2, ... per (source, epoch, stream); a `Gap` record
takes a seq of its own. A record whose seq jumps past `last + 1` reveals a hole the
collector reports (detected_by='collector'); the first record of an unseen epoch
reveals a hole when its seq is not 0. Seqs at or below `last` (publisher retries) are
not holes.

State is kept per Kafka partition (one source always lives in one partition) and is
rebuilt from ClickHouse on assignment (`restore`): the largest stored seq per source
and epoch, counting the collector's own gap rows, which store the seq of the record
that revealed them. Because gap rows are inserted before the rows of their batch, a
crash between the two inserts leaves the gap stored and its record not: the restored
state then already covers the hole, so it is reported neither twice nor never.

State is bounded: each partition keeps the `MAX_TRACKED` most recently seen (instance,
dp_rank, epoch), least recently seen first out (engines restarting often make many short
epochs). A source evicted and seen again is an unseen epoch: a hole before its seq is
reported from seq 0 (documented in docs/collector.md).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable

from kvscope.schemas import Envelope

SourceEpoch = tuple[str, int, int]
"""(instance, dp_rank, epoch)."""
MAX_TRACKED = 50_000
"""(instance, dp_rank, epoch) entries kept per Kafka partition (about 150 bytes each)."""


@dataclasses.dataclass(frozen=True)
class SeqGap:
    """A hole seen by the collector: seqs first_seq..last_seq of the revealing record's source."""

    offset: int
    """Kafka offset of the record that revealed the hole."""
    envelope: Envelope
    """That record (its source, epoch, seq and ts go into the gap row)."""
    first_seq: int
    last_seq: int


class GapTracker:
    """Last seen seq per source and epoch, per Kafka partition."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self._last: dict[tuple[str, int], dict[SourceEpoch, int]] = {}
        self.max_tracked = max_tracked
        """Entries kept per partition (in least-recently-seen-first order)."""

    def tracked(self, topic: str, partition: int) -> int:
        """How many (instance, dp_rank, epoch) the partition's state holds."""
        return len(self._last.get((topic, partition), ()))

    def restore(
        self, topic: str, partition: int, rows: Iterable[tuple[str, int, int, int]]
    ) -> None:
        """Set a partition's state from stored (instance, dp_rank, epoch, max seq) rows.

        Rows come oldest first; only the newest `max_tracked` are kept.
        """
        last = {(instance, dp_rank, epoch): seq for instance, dp_rank, epoch, seq in rows}
        while len(last) > self.max_tracked:
            del last[next(iter(last))]
        self._last[(topic, partition)] = last

    def forget(self, topic: str, partition: int) -> None:
        """Drop a partition's state (it was revoked; the next owner restores it)."""
        self._last.pop((topic, partition), None)

    def reveals_hole(self, topic: str, partition: int, source: SourceEpoch, seq: int) -> bool:
        """Whether a record of `source` with `seq` would reveal a hole now (state unchanged)."""
        previous = self._last.get((topic, partition), {}).get(source, -1)
        return seq > previous + 1

    def observe(
        self,
        topic: str,
        partition: int,
        streams: Iterable[tuple[list[int], list[Envelope]]],
    ) -> list[SeqGap]:
        """Advance the partition's state over records in offset order; return the holes.

        `streams` are (offsets, envelopes) lists, each in offset order (e.g. data
        records and Gap records); they are merged by offset.
        """
        last = self._last.setdefault((topic, partition), {})
        found: list[SeqGap] = []
        merged = heapq.merge(*(zip(offs, envs, strict=True) for offs, envs in streams))
        for offset, envelope in merged:
            source = envelope.source
            key = (source.instance, source.dp_rank, envelope.epoch)
            seq = envelope.seq
            previous = last.pop(key, -1)
            if seq > previous + 1:
                found.append(SeqGap(offset, envelope, previous + 1, seq - 1))
            last[key] = max(seq, previous)
            if len(last) > self.max_tracked:
                del last[next(iter(last))]
        return found

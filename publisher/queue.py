"""The record queue between publishing threads and the sender, and its loss ledger.

`RecordQueue` is what both sides of a `KafkaPublisher` share: callers append `Item`s
(never blocking: a full queue is a drop), the sender thread pops them. Every drop goes
through `lost()`, which counts it in `kvscope_publisher_dropped` and books the seq
range in the `LossLedger` until a `Gap` record reporting it is delivered.

Drops happen on the caller's thread (queue full) and on the sender's thread (delivery
failed); one lock guards the ledger. Adjacent losses with the same reason merge into one
range whatever order they are booked in, so an outage that loses seqs 10..5000 becomes a
single Gap. The ledger is bounded:
past `MAX_RANGES_PER_STREAM` pending ranges of one (source, stream) its adjacent ranges
merge whatever their reasons (still exact), and past twice that the oldest two merge
into the span between them (a Gap may then name seqs that did arrive, which readers
already tolerate: the record wins).

The queue also decides when the sender wakes: `put()` calls `waker` when the sender
sleeps idle (`armed`, the first record after a quiet spell) or the queue reached
`full_at` records (a full batch); otherwise the sender wakes only when its linger expires.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from kvscope.schemas import AnyBody, Source

Convert = Callable[[Any], AnyBody]
"""Turns an engine-native object into a kvscope body, on the sender thread."""


class QueuedSource(Protocol):
    """What the sender needs from the source that queued an item (a `SourcePublisher`)."""

    source: Source
    epoch: int
    key: bytes

    def take_seq(self, stream: str) -> int:
        """Reserve one seq of `stream` (for a Gap record the sender emits)."""
        ...

    def __hash__(self) -> int:
        """Hashable: the loss ledger books lost seqs by (source, stream)."""
        ...


class Item(NamedTuple):
    """One queued record: who, which stream, its seq, and the body (or raw engine object)."""

    source: QueuedSource
    stream: str
    seq: int
    ts: float
    body: Any
    convert: Convert | None
    enqueued: float


@dataclass
class LostRange:
    """Seqs first..last (inclusive) of one (source, stream), lost for `reason`."""

    owner: Hashable
    stream: str
    first: int
    last: int
    reason: str


MAX_RANGES_PER_STREAM = 16
"""Pending ranges of one (source, stream) before the ledger merges them."""


class LossLedger:
    """Pending lost ranges, in the order they were first seen (bounded per stream)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: list[LostRange] = []
        self._mine: dict[tuple[Hashable, str], list[LostRange]] = {}

    def add(self, owner: Hashable, stream: str, first: int, last: int, reason: str) -> None:
        """Record seqs first..last of (owner, stream) as lost.

        The range joins any pending range of (owner, stream) with the same reason that
        ends right before it or starts right after it (both, bridging them), whichever
        order the losses come in: a Gap the sender emitted and got back lost re-adds its
        range after newer losses were booked.
        """
        key = (owner, stream)
        with self._lock:
            mine = self._mine.setdefault(key, [])
            before = after = None
            for pending in mine:
                if pending.reason == reason:
                    if pending.last + 1 == first:
                        before = pending
                    elif pending.first == last + 1:
                        after = pending
            if before is not None and after is not None:
                before.last = after.last
                mine.remove(after)
                self._ranges.remove(after)
            elif before is not None:
                before.last = last
            elif after is not None:
                after.first = first
            else:
                lost = LostRange(owner, stream, first, last, reason)
                self._ranges.append(lost)
                mine.append(lost)
                if len(mine) > MAX_RANGES_PER_STREAM:
                    self._compact(key)

    def _compact(self, key: tuple[Hashable, str]) -> None:
        """Merge the ranges of `key`: adjacent ones first (exact), then the oldest two."""
        mine = sorted(self._mine[key], key=lambda r: r.first)
        merged = [mine[0]]
        for lost in mine[1:]:
            last = merged[-1]
            if lost.first <= last.last + 1:
                last.last = max(last.last, lost.last)
                last.reason = _joined(last.reason, lost.reason)
            else:
                merged.append(lost)
        if len(merged) > MAX_RANGES_PER_STREAM:
            oldest, second = merged[0], merged.pop(1)
            oldest.last = max(oldest.last, second.last)
            oldest.reason = _joined(oldest.reason, second.reason)
        keep = {id(r) for r in merged}
        self._ranges = [r for r in self._ranges if (r.owner, r.stream) != key or id(r) in keep]
        self._mine[key] = [r for r in self._ranges if (r.owner, r.stream) == key]

    def pending(self) -> list[LostRange]:
        """Copies of the pending ranges, without taking them (tests and debugging read it)."""
        with self._lock:
            return [LostRange(r.owner, r.stream, r.first, r.last, r.reason) for r in self._ranges]

    def take(self) -> list[LostRange]:
        """Remove and return every pending range (the caller reports or re-adds them)."""
        with self._lock:
            ranges, self._ranges = self._ranges, []
            self._mine.clear()
            return ranges

    def __len__(self) -> int:
        return len(self._ranges)


def _joined(first: str, second: str) -> str:
    """The reason of two merged ranges: both names once, in order ("a+b")."""
    reasons = first.split("+")
    return first if second in reasons else f"{first}+{second}"


def _nothing() -> None:
    """The waker of a queue nobody drains yet."""


class DropCounter(Protocol):
    """A labelled counter of dropped records (`PublisherMetrics.dropped`)."""

    def labels(self, *, stream: str, reason: str) -> Any:
        """The child counter of one (stream, reason)."""
        ...


class RecordQueue:
    """A bounded FIFO of `Item`s plus the ledger of what was lost on the way.

    `put()` never blocks: past `capacity` it refuses and the caller reports the loss.
    The bound is checked without a lock, so concurrent callers may overshoot it by one
    item each (the deque itself is thread-safe).
    """

    def __init__(self, capacity: int, dropped: DropCounter) -> None:
        self.capacity = capacity
        self.full_at = max(1, capacity // 4)
        """A full batch: `put()` wakes the sender when the queue reaches this many records."""
        self.armed = False
        """True while the sender sleeps until the next record (set by the sender)."""
        self.waker: Callable[[], None] = _nothing
        """Wakes the sender (from any thread); set by the publisher."""
        self.losses = LossLedger()
        self._items: deque[Item] = deque()
        self._dropped = dropped
        self._dropped_children: dict[tuple[str, str], Any] = {}

    def __len__(self) -> int:
        """Records waiting for the sender (the queue depth)."""
        return len(self._items)

    def put(self, item: Item) -> bool:
        """Append `item` unless the queue is full; False means it was not queued."""
        items = self._items
        if len(items) >= self.capacity:
            return False
        items.append(item)
        if self.armed or len(items) == self.full_at:
            self.armed = False
            self.waker()
        return True

    def pop(self) -> Item:
        """The oldest queued item (raises IndexError when empty)."""
        return self._items.popleft()

    def lost(self, owner: Hashable, stream: str, first: int, last: int, reason: str) -> None:
        """Count seqs first..last as dropped and schedule a Gap naming them."""
        self.losses.add(owner, stream, first, last, reason)
        child = self._dropped_children.get((stream, reason))
        if child is None:
            child = self._dropped.labels(stream=stream, reason=reason)
            self._dropped_children[(stream, reason)] = child
        child.inc(last - first + 1)

    def expire(self, enqueued_before: float, reason: str) -> None:
        """Drop (and report) queued items enqueued before the monotonic time given."""
        items = self._items
        while items and items[0].enqueued < enqueued_before:
            item = items.popleft()
            self.lost(item.source, item.stream, item.seq, item.seq, reason)

    def clear(self) -> int:
        """Forget every queued item without reporting it; how many there were."""
        left = len(self._items)
        self._items.clear()
        return left

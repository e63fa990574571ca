"""The record queue between publishing threads and the sender, and its loss ledger.

`RecordQueue` is what both sides of a `KafkaPublisher` share: callers append `Item`s
(never blocking: a full queue is a drop), the sender thread pops them. Every drop goes
through `lost()`, which counts it in `kvscope_publisher_dropped` and books the seq
range in the `LossLedger` until a `Gap` record reporting it is delivered.

Drops happen on the caller's thread (queue full) and on the sender's thread (delivery
failed); one lock guards the ledger. Adjacent losses with the same reason merge into one
range, so an outage that loses seqs 10..5000 becomes a single Gap.
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


class LossLedger:
    """Pending lost ranges, in the order they were first seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: list[LostRange] = []
        self._tail: dict[tuple[Hashable, str], LostRange] = {}

    def add(self, owner: Hashable, stream: str, first: int, last: int, reason: str) -> None:
        """Record seqs first..last of (owner, stream) as lost."""
        with self._lock:
            tail = self._tail.get((owner, stream))
            if tail is not None and tail.reason == reason and tail.last + 1 == first:
                tail.last = last
                return
            lost = LostRange(owner, stream, first, last, reason)
            self._ranges.append(lost)
            self._tail[(owner, stream)] = lost

    def take(self) -> list[LostRange]:
        """Remove and return every pending range (the caller reports or re-adds them)."""
        with self._lock:
            ranges, self._ranges = self._ranges, []
            self._tail.clear()
            return ranges

    def __len__(self) -> int:
        return len(self._ranges)


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
        self.losses = LossLedger()
        self._items: deque[Item] = deque()
        self._dropped = dropped
        self._dropped_children: dict[tuple[str, str], Any] = {}

    def __len__(self) -> int:
        """Records waiting for the sender (the queue depth)."""
        return len(self._items)

    def put(self, item: Item) -> bool:
        """Append `item` unless the queue is full; False means it was not queued."""
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
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

"""Bookkeeping of lost seq ranges until a `Gap` record reporting them is delivered.

Drops happen on the caller's thread (queue full) and on the sender's thread (delivery
failed); one lock guards the ledger. Adjacent losses with the same reason merge into one
range, so an outage that loses seqs 10..5000 becomes a single Gap.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass


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

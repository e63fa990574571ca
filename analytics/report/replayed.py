"""The window's access stream, kept once for every replay the report runs: the levers, and
each half of the window replayed from the state the caches had when it began.

A half replayed from cold caches misses what the window's earlier part had cached, so both
halves could need more memory than the whole window. Replaying the window up to the half's
end and counting only the accesses from its start (`count_from_us`) splits the whole
window's replay exactly: the halves' replays add up to it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kvscope.cachemodel.access_replay import Access
from kvscope.cachemodel.whatif import replay_gains


@dataclass(frozen=True)
class Replayed:
    """The window's accesses and clears, and the what-if rows of the sources that prefill
    (their capacity and extra blocks per fraction): what the replays start from."""

    accesses: list[Access]
    clears: list[tuple[str, int]]
    sources: list[dict[str, Any]]

    def capacity(self) -> dict[str, int]:
        """Blocks of each source that has accesses."""
        seen = {a.source for a in self.accesses}
        sizes = {_key(r): int(r["capacity_blocks"]) for r in self.sources}
        return {k: v for k, v in sizes.items() if k in seen}

    def fraction_reaching(
        self, since: datetime, until: datetime, hits: int, queries: int, target: float
    ) -> float | None:
        """The smallest extra fraction (of the what-if rows) at which the part [since,
        until) of the window, observed at `hits` of `queries` prompt tokens, reaches
        `target`, replayed from the state the caches had at `since`; None: none does."""
        capacity = self.capacity()
        start_us, end_us = _us(since), _us(until)
        window = [a for a in self.accesses if a.arrival_us < end_us]
        extras: dict[float, dict[str, int]] = defaultdict(dict)
        for r in self.sources:
            if _key(r) in capacity:
                extras[float(r["fraction"])][_key(r)] = int(r["extra_blocks"])
        observed: dict[str, int] = defaultdict(int)
        for a in window:
            if a.arrival_us >= start_us:
                observed[a.source] += a.prompt_tokens

        def reaches(fraction: float) -> bool:
            one = {fraction: extras[fraction]}
            _, gains = replay_gains(window, self.clears, capacity, one, count_from_us=start_us)
            saved = sum(gains[(k, fraction)] * observed[k] for k in capacity)
            return (hits + saved) / queries >= target

        return first_reaching(sorted(extras), reaches)


def first_reaching(fractions: list[float], reaches: Callable[[float], bool]) -> float | None:
    """The smallest of the sorted `fractions` that `reaches` the target (None: none does),
    by bisection: more capacity gives at least the hits of less (a few replays, not one per
    point of the curve)."""
    low, high = 0, len(fractions)
    while low < high:
        middle = (low + high) // 2
        if reaches(fractions[middle]):
            high = middle
        else:
            low = middle + 1
    return fractions[low] if low < len(fractions) else None


def _key(row: dict[str, Any]) -> str:
    return f"{row['instance']}/{row['dp_rank']}"


def _us(ts: datetime) -> int:
    """`ts` (naive UTC or aware) as whole µs since the epoch."""
    aware = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts
    return round(aware.timestamp() * 1e6)

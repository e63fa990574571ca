"""Mattson's stack distances over an access stream: the LRU hit curve for every size in one pass.

Under pure LRU a block is cached in a cache of C blocks exactly when fewer than C distinct
blocks were used since its own last use (its stack distance). vLLM's free queue is LRU by
release time (a finished request's blocks go back tail first, so its head is the most
recent), which is what this pass feeds it: every request's blocks are "used" when it
releases them, in reverse order, and its prompt is looked up at admission. What pure LRU
ignores is that blocks of running requests are pinned (they occupy the cache but cannot be
evicted), so the curve is optimistic when much of the pool is in use; docs/analytics.md has
its errors next to the pool replay's (`access_replay`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence

from kvscope.cachemodel.access_replay import Access


class _Fenwick:
    """Prefix sums over positions 1..n with point updates, O(log n) each."""

    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        while i < len(self.tree):
            self.tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def lru_hits(
    accesses: Sequence[Access], sizes: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """Per source, the prefix-hit tokens a pure-LRU cache of each of `sizes[source]` would have."""
    out: dict[str, list[int]] = {}
    for source, caps in sizes.items():
        mine = [a for a in accesses if a.source == source]
        out[source] = _source_hits(mine, list(caps))
    return out


def _source_hits(accesses: Sequence[Access], caps: list[int]) -> list[int]:
    touches = sum(len(a.hashes) for a in accesses)
    tree = _Fenwick(touches)
    last: dict[int, int] = {}
    clock = 0
    hits = [0] * len(caps)
    tie = itertools.count()
    events = [(a.lookup_us, 1, next(tie), a) for a in accesses]
    events += [(a.free_us, 0, next(tie), a) for a in accesses]
    heapq.heapify(events)
    while events:
        _, kind, _, a = heapq.heappop(events)
        if kind == 1:
            worst = -1
            lead = []
            for h in a.hashes[: a.lookup_limit]:
                t = last.get(h)
                if t is None:
                    break
                worst = max(worst, len(last) - tree.prefix(t))
                lead.append(worst)
            for k, c in enumerate(caps):
                hits[k] += sum(1 for d in lead if d < c) * a.block_size
            continue
        for h in reversed(a.hashes):
            t = last.get(h)
            if t is not None:
                tree.add(t, -1)
            clock += 1
            tree.add(clock, 1)
            last[h] = clock
    return hits

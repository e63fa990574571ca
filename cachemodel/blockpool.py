"""A vLLM-like KV block pool for the fleet simulator: prefix caching with LRU eviction.

Mirrors `vllm/v1/core/block_pool.py` (vLLM 0.32) where it matters for the events:
- a block is cached under the chained hash of its full token block
  (`hash(parent_hash, tokens)`, like `hash_block_tokens`);
- reference counts: a block with `ref_cnt == 0` sits in the free queue and stays a
  prefix-cache hit until it is reallocated;
- the free queue is LRU: allocation pops from the front; freed hashed blocks go to the
  back, unhashed ones to the front; callers free a request's blocks in reverse order so
  that the tail of a sequence is evicted before its head (vLLM frees `reversed(blocks)`);
- reallocating a hashed block evicts it (one `BlockRemoved` per hash, as vLLM emits);
- newly full blocks are committed in runs, one `BlockStored` per run with its parent;
- `reset()` drops every hash (`AllBlocksCleared`) and only works when nothing is in use.

One deliberate difference: vLLM may cache a second physical copy of a hash that is
already cached (it never de-duplicates); the simulator keeps one copy per hash, so a
hash is stored again only after it left the cache. Residency then has one meaning.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

NONE_HASH = int.from_bytes(hashlib.blake2b(b"kvscope-sim-root", digest_size=8).digest(), "big")
"""Parent hash used for the first block of a sequence (vLLM's NONE_HASH)."""


def hash_block(parent: int | None, tokens: Sequence[int]) -> int:
    """The 64-bit chained hash of one full token block (blake2b of parent and tokens)."""
    data = (NONE_HASH if parent is None else parent).to_bytes(8, "big")
    data += array("I", tokens).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def chain_hashes(
    tokens: Sequence[int], block_size: int, start_block: int = 0, prev: list[int] | None = None
) -> list[int]:
    """Hashes of the full blocks of `tokens` from `start_block` on, chained onto `prev`.

    `prev` holds the hashes of blocks 0..start_block-1 (the chain so far).
    """
    hashes = list(prev or [])
    parent = hashes[start_block - 1] if start_block else None
    for i in range(start_block, len(tokens) // block_size):
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class PoolEvent:
    """One KV-cache event as vLLM emits it: a stored run, one removed hash, or a clear."""

    kind: Literal["stored", "removed", "cleared"]
    hashes: list[int] = field(default_factory=list)
    parent: int | None = None
    """Hash of the block before the run (stored only); None at the start of a sequence."""


class BlockPool:
    """Fixed-size pool of KV blocks with a prefix cache and an LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        """hash -> block id of every block in the prefix cache (in use or free)."""
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._events: list[PoolEvent] = []

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, possibly holding an evictable hash)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's `kv_cache_usage`)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def longest_prefix(self, hashes: Sequence[int], max_blocks: int) -> int:
        """How many leading hashes (at most `max_blocks`) are cached: the prefix hit."""
        n = 0
        for h in hashes[:max_blocks]:
            if h not in self.cached:
                break
            n += 1
        return n

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on cached blocks (a prefix hit), removing free ones from the queue."""
        for b in block_ids:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Pop `n` blocks from the front of the free queue, evicting their hashes."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot allocate {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                del self.cached[h]
                self.block_hash[b] = None
                self._events.append(PoolEvent("removed", [h]))
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def commit(self, block_ids: Sequence[int], hashes: Sequence[int], start: int, end: int) -> None:
        """Cache blocks start..end-1 of a sequence under their chained hashes.

        Blocks already hashed (hits) are skipped, as are hashes cached in another block
        (one copy per hash); every contiguous run of new hashes is one `BlockStored`.
        """
        run: list[int] = []
        run_parent: int | None = None
        for i in range(start, end):
            b, h = block_ids[i], hashes[i]
            if self.block_hash[b] is not None or h in self.cached:
                if run:
                    self._events.append(PoolEvent("stored", run, run_parent))
                    run = []
                continue
            self.block_hash[b] = h
            self.cached[h] = b
            if not run:
                run_parent = hashes[i - 1] if i else None
            run.append(h)
        if run:
            self._events.append(PoolEvent("stored", run, run_parent))

    def free(self, ordered_block_ids: Iterable[int]) -> None:
        """Drop one reference per block, in eviction-priority order (first evicted first).

        Blocks reaching zero go to the back of the queue if hashed (LRU), to the front if
        not (they can never be a hit), as vLLM's `free_blocks` does.
        """
        unhashed = []
        for b in ordered_block_ids:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    unhashed.append(b)
                else:
                    self.free_queue[b] = None
        for b in reversed(unhashed):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)

    def reset(self) -> bool:
        """Drop every cached hash (vLLM's reset_prefix_cache); False while blocks are in use."""
        if len(self.free_queue) != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self._events.append(PoolEvent("cleared"))
        return True

    def take_events(self) -> list[PoolEvent]:
        """Return and forget the events produced since the last call."""
        events, self._events = self._events, []
        return events

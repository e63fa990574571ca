"""The simulator's block pool: vLLM semantics, and a brute-force reference model."""

from __future__ import annotations

import random

import pytest
from kvscope.cachemodel.blockpool import BlockPool, PoolEvent, chain_hashes, hash_block


def _events(pool: BlockPool) -> list[tuple[str, list[int], int | None]]:
    return [(e.kind, e.hashes, e.parent) for e in pool.take_events()]


def test_hash_chain_is_deterministic_and_chained() -> None:
    tokens = list(range(40))
    hashes = chain_hashes(tokens, 16)
    assert len(hashes) == 2
    assert hashes == chain_hashes(tokens, 16)
    assert hashes[0] == hash_block(None, tokens[:16])
    assert hashes[1] == hash_block(hashes[0], tokens[16:32])
    assert hash_block(1, tokens[:16]) != hash_block(2, tokens[:16])
    assert chain_hashes(tokens + [1] * 30, 16, 2, hashes)[:2] == hashes
    assert all(0 <= h < 2**64 for h in hashes)


def _cache_sequence(pool: BlockPool, hashes: list[int]) -> list[int]:
    blocks = pool.allocate(len(hashes))
    pool.commit(blocks, hashes, 0, len(hashes))
    return blocks


def test_freed_sequence_is_evicted_tail_first_and_lru() -> None:
    pool = BlockPool(4, 16)
    a = _cache_sequence(pool, [1, 2, 3])
    assert _events(pool) == [("stored", [1, 2, 3], None)]
    pool.free(reversed(a))
    pool.allocate(2)
    # one never-used block goes first, then the tail of the freed sequence
    assert _events(pool) == [("removed", [3], None)]
    pool.allocate(1)
    assert _events(pool) == [("removed", [2], None)]


def test_touched_blocks_are_not_evicted_while_in_use() -> None:
    pool = BlockPool(3, 16)
    a = _cache_sequence(pool, [1, 2, 3])
    pool.free(reversed(a))
    assert pool.longest_prefix([1, 2, 9], 3) == 2
    pool.touch([pool.cached[1], pool.cached[2]])
    pool.take_events()
    pool.allocate(1)
    assert _events(pool) == [("removed", [3], None)]
    with pytest.raises(ValueError):
        pool.allocate(1)


def test_commit_keeps_one_copy_per_hash_and_splits_runs() -> None:
    pool = BlockPool(8, 16)
    _cache_sequence(pool, [5])
    pool.take_events()
    blocks = pool.allocate(3)
    pool.commit(blocks, [4, 5, 6], 0, 3)
    assert _events(pool) == [("stored", [4], None), ("stored", [6], 5)]
    assert pool.block_hash[blocks[1]] is None


def test_reset_needs_an_idle_pool() -> None:
    pool = BlockPool(4, 16)
    a = _cache_sequence(pool, [1, 2])
    pool.take_events()
    assert not pool.reset()
    pool.free(reversed(a))
    assert pool.reset()
    assert _events(pool) == [("cleared", [], None)]
    assert pool.cached == {} and pool.longest_prefix([1], 1) == 0


class ReferencePool:
    """Brute-force vLLM block pool: the free queue is a plain list, scanned linearly."""

    def __init__(self, n: int) -> None:
        self.free = list(range(n))
        self.ref = [0] * n
        self.hash: list[int | None] = [None] * n
        self.events: list[PoolEvent] = []

    def cached(self) -> dict[int, int]:
        return {h: b for b, h in enumerate(self.hash) if h is not None}

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = self.free.pop(0)
            if self.hash[b] is not None:
                self.events.append(PoolEvent("removed", [self.hash[b]]))  # type: ignore[list-item]
                self.hash[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def commit(self, blocks: list[int], hashes: list[int]) -> None:
        cached = self.cached()
        run: list[int] = []
        parent = None
        for i, (b, h) in enumerate(zip(blocks, hashes, strict=True)):
            if self.hash[b] is not None or h in cached:
                if run:
                    self.events.append(PoolEvent("stored", run, parent))
                run = []
                continue
            if not run:
                parent = hashes[i - 1] if i else None
            self.hash[b] = h
            cached[h] = b
            run.append(h)
        if run:
            self.events.append(PoolEvent("stored", run, parent))

    def release(self, blocks: list[int]) -> None:
        front = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash[b] is None:
                    front.append(b)
                else:
                    self.free.append(b)
        self.free = front + self.free


@pytest.mark.parametrize("seed", range(5))
def test_pool_matches_brute_force_model(seed: int) -> None:
    rng = random.Random(seed)
    pool, ref = BlockPool(24, 4), ReferencePool(24)
    prefixes = [[rng.randrange(50) for _ in range(4 * rng.randint(1, 3))] for _ in range(4)]
    running: list[list[int]] = []
    for _ in range(400):
        if running and (rng.random() < 0.45 or len(running) > 3):
            blocks = running.pop(rng.randrange(len(running)))
            pool.free(reversed(blocks))
            ref.release(blocks)
        elif not running and rng.random() < 0.05:
            assert pool.reset()
            ref.hash = [None] * 24
            ref.events.append(PoolEvent("cleared"))
        else:
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            hashes = chain_hashes(tokens, 4)
            hit = pool.longest_prefix(hashes, len(hashes))
            hits = [pool.cached[h] for h in hashes[:hit]]
            need = len(hashes) - hit
            if need > pool.num_free - sum(1 for b in hits if pool.ref_cnt[b] == 0):
                continue
            pool.touch(hits)
            ref.touch(hits)
            blocks = hits + pool.allocate(need)
            assert blocks[hit:] == ref.allocate(need)
            pool.commit(blocks, hashes, hit, len(hashes))
            ref.commit(blocks, hashes)
            running.append(blocks)
        assert list(pool.free_queue) == ref.free
        assert pool.cached == ref.cached()
        assert pool.take_events() == ref.events
        ref.events = []
        assert all((pool.ref_cnt[b] == 0) == (b in pool.free_queue) for b in range(24))

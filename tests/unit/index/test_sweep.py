"""Dropping slots without a pass over the buckets: `BlockTable` against a plain dict while
slots are dropped and renumbered, zombies are swept in steps of every size and the table
grows in between; and `PrefixIndex` leaving the bucket work of forgetting and of a new
epoch to its sweep while its answers are exact at once."""

from __future__ import annotations

import asyncio
import collections
import random

import numpy as np
import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index import table as table_module
from kvscope.index.config import IndexConfig
from kvscope.index.service import IndexService
from kvscope.index.state import PrefixIndex
from kvscope.index.table import REMOVE, STORE, BlockTable, Ops
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch

Model = dict[int, collections.Counter[int]]
"""Per slot: hash -> copies held."""


def _check(table: BlockTable, model: Model, slots: list[int]) -> None:
    """The table holds what `model` holds for `slots`, and its own books add up: buckets,
    zombies, how many buckets name each set, the sets in use."""
    for slot in slots:
        held = model.get(slot, collections.Counter())
        listed, end = table.list_hashes([slot], 0, table.size)
        assert end == table.size and sorted(listed) == sorted(held)
        assert table.resident(slot) == len(held)
    assert table.hashes == len({h for held in model.values() for h in held})
    assert table.entries == sum(len(held) for held in model.values())
    assert table.extra_copies == sum(n - 1 for held in model.values() for n in held.values())
    sets = table._sets[table._sets != 0].astype(np.int64)
    assert table._counts[0] == len(sets)
    empty = ~table._masks.any(axis=1)
    assert table.zombies == int(empty[sets].sum())
    named = np.bincount(sets, minlength=len(table._refs))
    assert np.array_equal(named[: len(table._refs)], table._refs)
    assert table.sets_in_use == int((table._refs[1:] > 0).sum())


def _ops(rng: random.Random, universe: list[int], slots: list[int], model: Model, n: int) -> Ops:
    """`n` random stores and removals (some of hashes the slot does not hold), applied to
    the model; the table's ops."""
    hashes, on, kinds = [], [], []
    for _ in range(n):
        slot = rng.choice(slots)
        held = model.setdefault(slot, collections.Counter())
        if held and rng.random() < 0.4:
            block = rng.choice(list(held)) if rng.random() < 0.9 else rng.choice(universe)
            kinds.append(REMOVE)
            if block in held:
                held[block] -= 1
                if not held[block]:
                    del held[block]
        else:
            block = rng.choice(universe)
            kinds.append(STORE)
            held[block] += 1
        hashes.append(block)
        on.append(slot)
    return (
        np.array(hashes, dtype=np.uint64),
        np.array(on, dtype=np.int32),
        np.array(kinds, dtype=np.int8),
    )


@pytest.mark.parametrize(
    ("seed", "n_slots", "universe"), [(1, 3, 40), (2, 70, 600), (3, 130, 3000)]
)
@pytest.mark.parametrize("budget", [1, 9, 500])
def test_drops_renumbering_and_partial_sweeps_keep_the_table_exact(
    seed: int, n_slots: int, universe: int, budget: int
) -> None:
    rng = random.Random(seed * 1000 + budget)
    table = BlockTable()
    hashes = [rng.getrandbits(64) for _ in range(universe)]
    slots = list(range(n_slots))
    table.ensure_slot(n_slots - 1)
    model: Model = {}
    for step in range(160):
        roll = rng.random()
        if roll < 0.55:
            table.apply(_ops(rng, hashes, slots, model, rng.choice((1, 20, 400))))
        elif roll < 0.65:  # sources cleared or restarted: their slots stay theirs
            gone = rng.sample(slots, rng.randint(1, max(1, len(slots) // 3)))
            table.drop_slots(gone)
            for slot in gone:
                model.pop(slot, None)
        elif roll < 0.72:  # sources forgotten: the others renumbered (in any order)
            kept = [s for s in slots if rng.random() < 0.7]
            numbers = rng.sample(range(len(kept)), len(kept))
            new_slot = np.full(max(slots) + 1, -1, dtype=np.int64)
            new_slot[kept] = numbers
            table.remap_slots(new_slot)
            model = {n: model[s] for s, n in zip(kept, numbers, strict=True) if s in model}
            slots = list(range(n_slots))  # new sources take the numbers after
            table.ensure_slot(n_slots - 1)
        else:
            table.sweep(budget)
        _check(table, model, slots if step % 20 == 0 else rng.sample(slots, 2))
    while table.sweep(budget):
        pass
    _check(table, model, slots)
    assert table.zombies == 0 and table.sets_in_use <= table.hashes


def _record(instance: str, epoch: int, hashes: list[int]) -> Envelope:
    events = [BlockStored(block_hashes=hashes, block_size=16, medium="GPU")]
    body = KVEventBatch(ts=0, events=events)  # type: ignore[arg-type]
    return Envelope(
        source=Source(instance=instance, model="m"), epoch=epoch, seq=0, ts=1.0, body=body
    )


@pytest.mark.parametrize("blocks", [3_000, 40_000])
def test_forgetting_and_a_new_epoch_leave_the_buckets_to_bounded_sweep_steps(
    monkeypatch: pytest.MonkeyPatch, blocks: int
) -> None:
    monkeypatch.setattr(table_module, "SWEEP_BUCKETS", 0)  # the applies' own steps do nothing
    rng = random.Random(blocks)
    shared = [rng.getrandbits(64) for _ in range(50)]
    own = {name: [rng.getrandbits(64) for _ in range(blocks)] for name in "abc"}
    index = PrefixIndex()
    for name, hashes in own.items():
        index.apply(_record(name, 1, shared + hashes))
    table = index.table
    keys, sets = table._keys.copy(), table._sets.copy()
    assert index.forget("a") == 1
    # the buckets are as they were: the forget cost the sets, not the table
    assert np.array_equal(table._keys, keys) and np.array_equal(table._sets, sets)
    index.apply(_record("b", 2, shared[:10]))  # b restarts: a new epoch
    assert table.zombies == 2 * blocks and table.hashes == blocks + 50
    scored = {s.instance: s.matched_blocks for s in index.score(shared + own["c"][:5]).sources}
    assert scored == {"b": 10, "c": 55}
    assert index.score(own["a"][:3]).sources[0].matched_blocks == 0
    assert index.score(own["b"][:3]).sources[0].matched_blocks == 0
    steps, size = 0, table.size
    step = size // 16
    while index.sweep(step):  # a look at a bucket or a deletion each
        steps += 1
    assert table.zombies == 0 and 1 <= steps <= (size + 2 * blocks) // step + 1
    fresh = PrefixIndex()
    fresh.apply(_record("b", 2, shared[:10]))
    fresh.apply(_record("c", 1, shared + own["c"]))
    assert table.hashes == fresh.table.hashes and table.size == fresh.table.size
    assert table.sets_in_use <= table.hashes


def test_the_service_sweeper_sweeps_in_steps_between_turns_of_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(table_module, "SWEEP_BUCKETS", 256)
    service = IndexService(IndexConfig(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9")))
    index = service.index
    rng = random.Random(7)
    for name in "ab":
        index.apply(_record(name, 1, [rng.getrandbits(64) for _ in range(5_000)]))
    index.forget("a")
    assert index.table.zombies == 5_000

    async def turns_until_swept() -> int:
        sweeper = asyncio.create_task(service._sweep())
        turns = 0
        while index.table.zombies:
            await asyncio.sleep(0)
            turns += 1
            assert turns < 100_000, "the sweeper made no progress"
        sweeper.cancel()
        return turns

    assert asyncio.run(turns_until_swept()) >= index.table.size // 256 // 2
    assert index.table.hashes == 5_000

"""Ground truth decoded without kvscope: engine ZMQ frames read with the engine's own structs.

vLLM frames are decoded with `vllm.distributed.kv_events.KVEventBatch` and their block
hashes converted with vLLM's own `maybe_convert_block_hash` (what vLLM does when it
publishes integer hashes); SGLang frames with the `KVEventBatch` of SGLang's module
(tests/data/sglang). The result is a list of `TruthEvent`s per frame; `kvscope_events`
puts kvscope's decoded `KVEventBatch` in the same form, so a test compares the two and a
bug in kvscope's engine decoder cannot cancel out.

The only knowledge written here by hand is what the wire format documents: hashes are
unsigned 64-bit (SGLang's signed ints in two's complement) and the medium names map
onto kvscope's tiers as `MEDIUMS` says.
"""

from __future__ import annotations

import os
import types
from typing import Any, NamedTuple
from unittest import mock

import msgspec
from kvscope.schemas import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

MEDIUMS = {
    None: "GPU",
    "GPU": "GPU",
    "CPU": "CPU",
    "CPU_PINNED": "CPU",
    "DISK": "DISK",
    "STORAGE": "DISK",
    "EXTERNAL": "EXTERNAL",
}
"""Engine medium name -> kvscope tier, as docs/wire-format.md documents it."""


class TruthEvent(NamedTuple):
    """One KV event, engine-neutral: what kvscope must carry of it."""

    kind: str
    hashes: tuple[int, ...]
    parent: int | None = None
    block_size: int = 0
    token_count: int = 0
    medium: str = "GPU"


def _vllm_hash(value: int | bytes) -> int:
    """A vLLM block hash as published with integer hashes, by vLLM's own conversion."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    if isinstance(value, bytes):
        with mock.patch.dict(os.environ, {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}):
            converted = maybe_convert_block_hash(value)
        assert isinstance(converted, int), "vLLM did not convert the hash"
        return converted
    assert 0 <= value < 1 << 64, f"vLLM published a hash out of range: {value}"
    return value


def _events(raw_events: list[Any], to_u64: Any) -> list[TruthEvent]:
    out = []
    for event in raw_events:
        kind = type(event).__name__
        if kind == "AllBlocksCleared":
            out.append(TruthEvent("cleared", ()))
            continue
        hashes = tuple(to_u64(h) for h in event.block_hashes)
        if kind == "BlockRemoved":
            out.append(TruthEvent("removed", hashes, medium=MEDIUMS[event.medium]))
            continue
        assert kind == "BlockStored", kind
        parent = event.parent_block_hash
        out.append(
            TruthEvent(
                "stored",
                hashes,
                None if parent is None else to_u64(parent),
                event.block_size,
                len(event.token_ids),
                MEDIUMS[event.medium],
            )
        )
    return out


class TruthBatch(NamedTuple):
    """One engine batch, engine-neutral."""

    ts: float
    events: list[TruthEvent]


def vllm_batch(payload: bytes) -> TruthBatch:
    """One vLLM ZMQ payload decoded with vLLM's own `KVEventBatch`."""
    from vllm.distributed import kv_events

    batch = msgspec.msgpack.decode(payload, type=kv_events.KVEventBatch)
    return TruthBatch(batch.ts, _events(batch.events, _vllm_hash))


def vllm_events(payload: bytes) -> list[TruthEvent]:
    """The events of one vLLM ZMQ payload (see `vllm_batch`)."""
    return vllm_batch(payload).events


def sglang_batch(module: types.ModuleType, payload: bytes) -> TruthBatch:
    """One SGLang ZMQ payload decoded with SGLang's own `KVEventBatch` (from `module`)."""
    batch = msgspec.msgpack.decode(payload, type=module.KVEventBatch)
    return TruthBatch(batch.ts, _events(batch.events, lambda h: h % (1 << 64)))


def kvscope_batch(batch: KVEventBatch) -> TruthBatch:
    """kvscope's decoded batch in `TruthBatch` form (the side under test)."""
    out = []
    for event in batch.events:
        if isinstance(event, AllBlocksCleared):
            out.append(TruthEvent("cleared", ()))
        elif isinstance(event, BlockRemoved):
            out.append(TruthEvent("removed", tuple(event.block_hashes), medium=event.medium))
        else:
            assert isinstance(event, BlockStored)
            out.append(
                TruthEvent(
                    "stored",
                    tuple(event.block_hashes),
                    event.parent_block_hash,
                    event.block_size,
                    event.token_count,
                    event.medium,
                )
            )
    return TruthBatch(batch.ts, out)


def block_rows(events_by_seq: dict[int, list[TruthEvent]]) -> list[tuple[int, int, int, str, int]]:
    """kv_block_events rows (seq, event index, position, event, hash) in publication order."""
    rows = []
    for seq in sorted(events_by_seq):
        for index, event in enumerate(events_by_seq[seq]):
            if event.kind == "cleared":
                rows.append((seq, index, 0, "cleared", 0))
            else:
                rows.extend((seq, index, p, event.kind, h) for p, h in enumerate(event.hashes))
    return rows

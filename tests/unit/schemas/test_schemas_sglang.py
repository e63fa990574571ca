"""Hand-written SGLang KV-event vectors, encoded with SGLang's own struct definitions.

The structs below mirror `python/sglang/srt/disaggregation/kv_events.py` of
sgl-project/sglang in the revisions seen upstream:
- first release: batch `[ts, events]`, positional events without `medium`;
- `attn_dp_rank` appended to the batch;
- `medium` appended to BlockStored / BlockRemoved (`StorageMedium`: GPU, CPU_PINNED,
  DISK, EXTERNAL) and `BlockStoredWithMetadata` (a trailing `metadata` map holding
  `cache_salt`);
- events as tagged maps (with `cache_salt`, `session_id`), as KV-router consumers copy them.
Block hashes come from SGLang's hashing (`mem_cache/utils.py`): SHA-256 page chains
turned into *signed* int64 by `hash_str_to_int64`, so negative hashes are normal.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

import msgspec
import pytest
from kvscope.schemas import BlockRemoved, BlockStored, DecodeError, decode_engine_payload


def get_hash_str(token_ids: list[int], prior_hash: str | None = None) -> str:
    """SGLang's page hash: SHA-256 over the prior digest and 4-byte little-endian tokens."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for token in token_ids:
        hasher.update(token.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def hash_str_to_int64(hash_str: str) -> int:
    """SGLang's event hash: the first 16 hex digits as a signed int64."""
    value = int(hash_str[:16], 16)
    return value - 2**64 if value >= 2**63 else value


def page_chain(pages: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """(event hashes, unsigned first-8-bytes values) of a chain of 4-token pages."""
    signed, unsigned, prior = [], [], None
    for page in range(pages):
        digest = get_hash_str([seed * 1000 + page * 4 + i for i in range(4)], prior)
        signed.append(hash_str_to_int64(digest))
        unsigned.append(int(digest[:16], 16))
        prior = digest
    return signed, unsigned


# --- first release -----------------------------------------------------------------
class EventBatchV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEventV1(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredV1(KVCacheEventV1, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemovedV1(KVCacheEventV1, tag="BlockRemoved"):
    block_hashes: list[int]


class AllBlocksClearedV1(KVCacheEventV1, tag="AllBlocksCleared"):
    pass


# --- attn_dp_rank, medium, metadata ---------------------------------------------------
class EventBatchV3(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEventV3(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class StorageMedium(enum.StrEnum):
    """SGLang declares `(str, enum.Enum)`; msgspec encodes both as the value."""

    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class BlockStoredV3(KVCacheEventV3, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockStoredWithMetadataV3(BlockStoredV3, tag="BlockStored", kw_only=True):
    metadata: BlockStoredMetadata


class BlockRemovedV3(KVCacheEventV3, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksClearedV3(KVCacheEventV3, tag="AllBlocksCleared"):
    pass


# --- events as tagged maps -------------------------------------------------------------
class KVCacheEventMap(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStoredMap(KVCacheEventMap, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None


class BlockRemovedMap(KVCacheEventMap, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


def _decode(batch: msgspec.Struct) -> Any:
    return decode_engine_payload(msgspec.msgpack.encode(batch), "sglang")


def test_first_release_without_medium_or_rank() -> None:
    signed, unsigned = page_chain(3)
    batch = EventBatchV1(
        ts=1700000000.5,
        events=[
            BlockStoredV1(signed, None, list(range(12)), 4, None),
            BlockRemovedV1(signed[1:]),
            AllBlocksClearedV1(),
        ],
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch))[1][0][0] == "BlockStored"
    out = _decode(batch)
    assert out.ts == 1700000000.5
    assert out.dp_rank is None
    stored, removed, cleared = out.events
    assert stored.block_hashes == unsigned
    assert stored.parent_block_hash is None
    assert (stored.block_size, stored.token_count, stored.token_ids) == (4, 12, None)
    assert (stored.medium, stored.medium_raw) == ("GPU", None)
    assert removed.block_hashes == unsigned[1:]
    assert type(cleared).__name__ == "AllBlocksCleared"


def test_negative_int64_hashes_become_the_unsigned_first_eight_digest_bytes() -> None:
    signed, unsigned = page_chain(64, seed=7)
    assert any(h < 0 for h in signed) and any(h >= 0 for h in signed)
    parent = signed[0]
    out = _decode(EventBatchV3(1.0, [BlockStoredV3(signed[1:], parent, [], 4, None)], 0))
    (stored,) = out.events
    assert stored.block_hashes == unsigned[1:]
    assert stored.parent_block_hash == unsigned[0]
    assert all(0 <= h < 2**64 for h in stored.block_hashes)
    assert [h & (2**64 - 1) for h in signed[1:]] == stored.block_hashes


@pytest.mark.parametrize(
    ("medium", "normalized"),
    [
        (StorageMedium.GPU, "GPU"),
        (StorageMedium.CPU, "CPU"),
        (StorageMedium.DISK, "DISK"),
        (StorageMedium.EXTERNAL, "EXTERNAL"),
        (None, "GPU"),
        ("NVME_OF", "UNKNOWN"),
    ],
)
def test_medium_names_are_normalized_and_kept_raw(
    medium: StorageMedium | str | None, normalized: str
) -> None:
    signed, unsigned = page_chain(2)
    batch = EventBatchV3(
        ts=2.0,
        events=[
            BlockStoredV3(signed, None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, medium=medium),
            BlockRemovedV3(signed, medium=medium),
        ],
        attn_dp_rank=3,
    )
    out = _decode(batch)
    raw = None if medium is None else str(getattr(medium, "value", medium))
    assert out.dp_rank == 3
    for event in out.events:
        assert (event.medium, event.medium_raw) == (normalized, raw)
        assert event.block_hashes == unsigned


def test_salted_block_stored_with_metadata() -> None:
    """BlockStoredWithMetadata adds an eighth element (a map); it must still decode."""
    signed, unsigned = page_chain(2, seed=3)
    salted = BlockStoredWithMetadataV3(
        block_hashes=signed,
        parent_block_hash=None,
        token_ids=list(range(8)),
        block_size=4,
        lora_id=None,
        medium=StorageMedium.CPU,
        metadata=BlockStoredMetadata(cache_salt="tenant-ä"),
    )
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(salted))
    assert len(wire) == 8 and wire[7] == {"cache_salt": "tenant-ä"}
    out = _decode(EventBatchV3(3.0, [salted, BlockStoredV3(signed, None, [], 4, None)], 1))
    first, second = out.events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.block_hashes == unsigned == second.block_hashes
    assert (first.medium, first.medium_raw, first.lora_name) == ("CPU", "CPU_PINNED", None)


def test_tagged_map_events_with_extra_fields() -> None:
    signed, unsigned = page_chain(2, seed=5)
    batch = EventBatchV3(
        ts=4.0,
        events=[
            BlockStoredMap(signed, None, [9] * 8, 4, 2, "DISK", "salt", "session-1"),
            BlockRemovedMap(signed[:1], "EXTERNAL"),
        ],
        attn_dp_rank=0,
    )
    stored, removed = _decode(batch).events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert (stored.block_hashes, stored.lora_id, stored.medium) == (unsigned, 2, "DISK")
    assert (removed.block_hashes, removed.medium) == (unsigned[:1], "EXTERNAL")


def test_keep_token_ids_forwards_the_tokens() -> None:
    signed, _ = page_chain(1)
    payload = msgspec.msgpack.encode(
        EventBatchV1(5.0, [BlockStoredV1(signed, None, [7] * 4, 4, 0)])
    )
    (stored,) = decode_engine_payload(payload, "sglang", keep_token_ids=True).events
    assert stored.token_ids == [7, 7, 7, 7] and stored.token_count == 4


@pytest.mark.parametrize(
    "batch",
    [
        [1.0, [["BlockStored", [1], None, [], -4, None]]],
        [1.0, [], -1],
        [1.0, [["BlockEvicted", [1]], ["BlockStored", [1], None, [], -4, None]]],
        [1.0, [["BlockStored", ["not-a-hash"], None, [], 4, None]]],
        [1.0],
        {"ts": 1.0},
    ],
    ids=["negative-block-size", "negative-rank", "unknown-and-bad", "str-hash", "short", "map"],
)
def test_invalid_sglang_payloads_raise_decode_error(batch: object) -> None:
    with pytest.raises(DecodeError, match="sglang payload"):
        decode_engine_payload(msgspec.msgpack.encode(batch), "sglang")


def test_unknown_engine_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="unknown engine 'trtllm'"):
        decode_engine_payload(b"\x90", "trtllm")

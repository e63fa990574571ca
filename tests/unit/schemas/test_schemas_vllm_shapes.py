"""vLLM payload shapes other than vLLM 0.32's (which the golden captures cover).

Structs mirror `vllm/distributed/kv_events.py` of vllm-project/vllm:
- older releases: events `array_like` too, so a BlockStored is
  `["BlockStored", hashes, parent, token_ids, block_size, lora_id(, medium)]`;
- spring 2026 (vllm-project/vllm#37688, #40984): still `array_like` events, now ending in
  `lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window`
  (BlockRemoved: `hashes, medium, group_idx`);
- newer sources: the batch itself is a map `{"ts", "events", "data_parallel_rank"}`,
  events tagged maps carrying `lora_name`, `extra_keys`, `group_idx`, cache-spec fields.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    decode_engine_batch,
    decode_engine_payload,
)

HIGH = 2**64 - 2  # a hash above 2**63, as vLLM's int hashes often are
MID = 2**63


class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldBlockStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class OldAllBlocksCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class NewEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class NewEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class NewBlockStored(NewEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class NewBlockRemoved(NewEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class NewAllBlocksCleared(NewEvent, tag="AllBlocksCleared"):
    pass


def _positional(event: type[msgspec.Struct], tag: str) -> Any:
    """The same event with `array_like` (vLLM's events before they became maps)."""
    fields = [
        (f.name, f.type) if f.required else (f.name, f.type, f.default)
        for f in msgspec.structs.fields(event)
    ]
    return msgspec.defstruct(f"Hma{event.__name__}", fields, bases=(OldEvent,), tag=tag)


HmaBlockStored = _positional(NewBlockStored, "BlockStored")
HmaBlockRemoved = _positional(NewBlockRemoved, "BlockRemoved")


def _decode(batch: msgspec.Struct, **kwargs: Any) -> Any:
    return decode_engine_payload(msgspec.msgpack.encode(batch), "vllm", **kwargs)


def test_old_positional_events() -> None:
    batch = OldEventBatch(
        ts=10.25,
        events=[
            OldBlockStored([MID, HIGH], 5, list(range(64)), 32, None, "GPU"),
            OldBlockRemoved([MID], "CPU"),
            OldAllBlocksCleared(),
        ],
        data_parallel_rank=2,
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch))[1][0][:2] == [
        "BlockStored",
        [MID, HIGH],
    ]
    out = _decode(batch)
    assert (out.ts, out.dp_rank) == (10.25, 2)
    stored, removed, cleared = out.events
    assert isinstance(stored, BlockStored)
    assert (stored.block_hashes, stored.parent_block_hash) == ([MID, HIGH], 5)
    assert (stored.block_size, stored.token_count, stored.medium) == (32, 64, "GPU")
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium, removed.medium_raw) == ([MID], "CPU", "CPU")
    assert isinstance(cleared, AllBlocksCleared)


def test_oldest_positional_events_without_medium() -> None:
    payload = msgspec.msgpack.encode(
        [1.5, [["BlockStored", [HIGH], None, [1, 2], 16, 7], ["BlockRemoved", [HIGH]]]]
    )
    stored, removed = decode_engine_payload(payload).events
    assert (stored.block_hashes, stored.lora_id, stored.medium_raw) == ([HIGH], 7, None)
    assert removed.block_hashes == [HIGH]


def test_positional_events_keep_the_kv_cache_group() -> None:
    """A hybrid model's sliding-window group (1) must not pass for the full-attention one."""
    batch = OldEventBatch(
        ts=5.0,
        events=[
            HmaBlockStored(
                block_hashes=[MID],
                parent_block_hash=None,
                token_ids=[1] * 16,
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name="adapter-1",
                extra_keys=[("adapter-1",)],
                group_idx=1,
                kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=128,
            ),
            HmaBlockStored([HIGH], None, [2] * 16, 16, None, "GPU", None, group_idx=0),
            HmaBlockRemoved([MID], "GPU", group_idx=1),
        ],
        data_parallel_rank=0,
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch))[1][2] == [
        "BlockRemoved",
        [MID],
        "GPU",
        1,
    ]
    swa, full, removed = _decode(batch).events
    assert (swa.block_hashes, swa.lora_name, swa.group_idx) == ([MID], "adapter-1", 1)
    assert (full.block_hashes, full.group_idx) == ([HIGH], 0)
    assert (removed.block_hashes, removed.group_idx) == ([MID], 1)


def test_map_batch_with_map_events_and_new_fields() -> None:
    digest = bytes(range(32))
    batch = NewEventBatch(
        ts=20.0,
        events=[
            NewBlockStored(
                [digest],
                HIGH,
                [3] * 16,
                16,
                None,
                "GPU",
                "adapter-1",
                extra_keys=[("adapter-1",)],
                group_idx=1,
                kv_cache_spec_kind="full_attention",
            ),
            NewBlockRemoved([digest], "STORAGE", group_idx=1),
            NewAllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    assert isinstance(msgspec.msgpack.decode(msgspec.msgpack.encode(batch)), dict)
    out = _decode(batch)
    stored, removed, _ = out.events
    expected = int.from_bytes(digest[-8:], "big")
    assert stored.block_hashes == [expected] and stored.parent_block_hash == HIGH
    assert (stored.lora_name, stored.group_idx) == ("adapter-1", 1)
    assert (removed.medium, removed.medium_raw, removed.group_idx) == ("DISK", "STORAGE", 1)
    assert out.dp_rank == 0


class TieredBlockStored(NewBlockStored, tag="BlockStored"):
    """vLLM 0.32's BlockStored: the offloading tier (`locality`, `ownership`) and the
    session after the cache-spec fields."""

    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class TieredBlockRemoved(NewBlockRemoved, tag="BlockRemoved"):
    locality: str | None = None
    ownership: str | None = None


PositionalTieredStored = _positional(TieredBlockStored, "BlockStored")
PositionalTieredRemoved = _positional(TieredBlockRemoved, "BlockRemoved")


@pytest.mark.parametrize("positional", [False, True])
@pytest.mark.parametrize(
    ("locality", "ownership", "tier"),
    [
        (None, None, None),
        ("LOCAL", None, None),
        ("REMOTE", None, "REMOTE"),
        ("LOCAL", "fs-1", "fs-1"),
        ("REMOTE", "obj-1", "REMOTE/obj-1"),
        (None, "obj-1", "obj-1"),
        ("", "", None),
    ],
)
def test_offloading_tiers_are_kept(
    positional: bool, locality: str | None, ownership: str | None, tier: str | None
) -> None:
    """Two tiers of one medium (an FS and an object store, both STORAGE) stay apart; a
    local tier without a name is the medium alone."""
    stored_type = PositionalTieredStored if positional else TieredBlockStored
    removed_type = PositionalTieredRemoved if positional else TieredBlockRemoved
    stored = stored_type(
        [HIGH], None, [], 0, None, "STORAGE", None, group_idx=0,
        locality=locality, ownership=ownership, session_id="s-1",
    )  # fmt: skip
    removed = removed_type([HIGH], "STORAGE", 0, locality, ownership)
    out = _decode(NewEventBatch(ts=2.0, events=[stored, removed]))
    assert [(e.medium, e.tier) for e in out.events] == [("DISK", tier)] * 2


def test_a_tier_that_is_not_a_string_is_ignored() -> None:
    """Tiers are names; another type neither fails the batch nor becomes a tier."""
    payload = msgspec.msgpack.encode(
        {"ts": 1.0, "events": [["BlockRemoved", [1], "CPU", 0, 7, ["x"]]]}
    )
    (removed,) = decode_engine_payload(payload).events
    assert (removed.medium, removed.tier) == ("CPU", None)


class NewBlockTransferred(NewEvent, tag="BlockTransferred"):
    """An event type of a newer engine than this kvscope (cross-tier moves)."""

    block_hashes: list[int | bytes]
    src_medium: str | None
    dst_medium: str | None


@pytest.mark.parametrize("positional", [False, True])
def test_events_of_an_unknown_type_are_skipped_and_named(positional: bool) -> None:
    """A newer engine's new event type must not cost the batch's known events."""
    events: list[Any] = [
        NewBlockStored([HIGH], None, [1] * 16, 16, None, "GPU", None),
        NewBlockTransferred([HIGH], "GPU", "CPU"),
        NewBlockRemoved([MID], "GPU"),
    ]
    if positional:
        events = [
            OldBlockStored([HIGH], None, [1] * 16, 16, None, "GPU"),
            ["BlockTransferred", [HIGH], "GPU", "CPU"],
            OldBlockRemoved([MID], "GPU"),
        ]
    payload = msgspec.msgpack.encode(OldEventBatch(ts=4.0, events=events, data_parallel_rank=2))
    batch, unknown = decode_engine_batch(payload, "vllm")
    assert unknown == ["BlockTransferred"]
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockRemoved"]
    assert (batch.events[0].block_hashes, batch.events[1].block_hashes) == ([HIGH], [MID])
    assert (batch.ts, batch.dp_rank) == (4.0, 2)
    assert decode_engine_batch(msgspec.msgpack.encode(OldEventBatch(1.0, [])), "vllm")[1] == []


def test_map_batch_without_rank() -> None:
    out = _decode(NewEventBatch(ts=1.0, events=[NewAllBlocksCleared()]))
    assert out.dp_rank is None and len(out.events) == 1


def test_map_batch_with_positional_events() -> None:
    payload = msgspec.msgpack.encode(
        {"ts": 3.0, "events": [["BlockRemoved", [1, 2], "GPU"]], "data_parallel_rank": 1}
    )
    (removed,) = decode_engine_payload(payload).events
    assert removed.block_hashes == [1, 2]


def test_token_ids_only_on_request() -> None:
    batch = OldEventBatch(1.0, [OldBlockStored([1], None, [5, 6, 7], 3, None, None)])
    assert _decode(batch).events[0].token_ids is None
    assert _decode(batch, keep_token_ids=True).events[0].token_ids == [5, 6, 7]


def test_short_hashes_map_like_long_ones() -> None:
    """Bytes of any length convert like vLLM's int.from_bytes(...) & (2**64 - 1)."""
    for raw in (b"\x01", b"\xff" * 8, b"\x00" * 24 + b"\x80" + b"\x00" * 7, b""):
        out = _decode(OldEventBatch(1.0, [OldBlockRemoved([raw], None)]))
        assert out.events[0].block_hashes == [int.from_bytes(raw, "big") & (2**64 - 1)]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x93\xcb", "truncated"),
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode([1.0, [{"type": "Nope"}, {"type": "BlockRemoved"}]]), "batch"),
        (msgspec.msgpack.encode([1.0, [{"type": 5}]]), "not a KV event batch"),
        (msgspec.msgpack.encode([1.0, [7]]), "not a KV event batch"),
        (msgspec.msgpack.encode("hello"), "not a KV event batch"),
    ],
)
def test_bad_vllm_payloads_say_what_is_wrong(payload: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_engine_payload(payload)

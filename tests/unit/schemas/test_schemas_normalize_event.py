"""`normalize_event`: one normalization for decoded ZMQ events and in-memory engine events."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_engine_payload,
    normalize_event,
)

STORED_DEFAULTS: dict[str, Any] = {
    "parent_block_hash": None,
    "token_ids": [],
    "block_size": 16,
    "lora_id": None,
    "medium": None,
    "lora_name": None,
}


def engine_event(kind: str, **fields: Any) -> object:
    """An in-memory engine event (duck-typed like vLLM's): a `kind`-named class's object."""
    if kind == "BlockStored":
        fields = STORED_DEFAULTS | fields
    return type(kind, (), fields)()


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 64])
def test_stored_events_normalize_hashes_medium_and_token_counts(keep: bool, tokens: int) -> None:
    raw = engine_event(
        "BlockStored",
        block_hashes=[b"\x01" * 32, -1],
        parent_block_hash=7,
        token_ids=list(range(tokens)),
        medium="cpu_pinned",
        lora_name="adapter",
    )
    event = normalize_event(raw, keep_token_ids=keep)
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [0x0101010101010101, (1 << 64) - 1]
    assert event.parent_block_hash == 7
    assert event.token_count == tokens
    assert event.token_ids == (list(range(tokens)) if keep else None)
    assert (event.medium, event.medium_raw, event.lora_name) == ("CPU", "cpu_pinned", "adapter")


def test_a_metadata_map_in_the_lora_name_slot_is_not_kept() -> None:
    raw = engine_event("BlockStored", block_hashes=[1], lora_name={"cache_salt": "s"})
    event = normalize_event(raw)
    assert isinstance(event, BlockStored)
    assert event.lora_name is None


def test_removed_cleared_and_unknown_events() -> None:
    removed = normalize_event(engine_event("BlockRemoved", block_hashes=[3], medium=None))
    assert removed == BlockRemoved(block_hashes=[3], medium="GPU", medium_raw=None)
    assert normalize_event(engine_event("AllBlocksCleared")) == AllBlocksCleared()
    assert normalize_event(engine_event("SomethingNew", block_hashes=[1])) is None


@pytest.mark.parametrize("array_events", [False, True])
def test_decoded_payloads_go_through_the_same_normalization(array_events: bool) -> None:
    if array_events:
        events: list[Any] = [
            ["BlockStored", [5], None, [1, 2], 16, None, "GPU"],
            ["AllBlocksCleared"],
        ]
    else:
        stored = {"type": "BlockStored", "block_hashes": [5], "token_ids": [1, 2]}
        events = [stored | {"block_size": 16, "medium": "GPU"}, {"type": "AllBlocksCleared"}]
    batch = decode_engine_payload(msgspec.msgpack.encode([1.0, events, 0]), "vllm")
    direct = normalize_event(engine_event("BlockStored", block_hashes=[5], token_ids=[1, 2]))
    assert isinstance(direct, BlockStored)
    assert batch.events == [msgspec.structs.replace(direct, medium_raw="GPU"), AllBlocksCleared()]

"""Engine adapters: vLLM and SGLang ZMQ KV-event payloads -> kvscope's `KVEventBatch`.

Accepted shapes (all seen in real engines):
- batch as an array `[ts, events, dp_rank]` (vLLM 0.x, SGLang) or a map
  `{"ts", "events", "data_parallel_rank"}` (newer vLLM sources);
- events as tagged maps `{"type": "BlockStored", ...}` (vLLM since mid-2025) or as
  positional arrays `["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`
  (older vLLM, SGLang). Position 8 of an array BlockStored is vLLM's `lora_name` or
  SGLang's `metadata` map (`BlockStoredWithMetadata`, `{"cache_salt": ...}`); vLLM's
  array events of spring 2026 (vllm-project/vllm#37688) go on with `extra_keys` and
  `group_idx` (BlockStored positions 9 and 10, BlockRemoved position 4), vLLM 0.32's with
  the cache-spec fields and the offloading tier's `locality` and `ownership` (BlockStored
  positions 13 and 14, BlockRemoved 5 and 6; `event_tier`); trailing elements beyond the
  known ones are ignored.
Events of a type kvscope does not know are skipped and named (`decode_engine_batch`).
Block hashes are normalized to unsigned 64-bit ints exactly as vLLM converts its
32-byte hashes (`int.from_bytes(h, "big") & (2**64 - 1)`, i.e. the last 8 bytes).
SGLang sends signed int64 hashes (`hash_str_to_int64`: the first 8 digest bytes read as
a signed int), so negative values map to their two's-complement unsigned value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, NamedTuple, get_args

import msgspec
from kvscope.schemas.codec import MALFORMED, explain_malformed
from kvscope.schemas.errors import DecodeError
from kvscope.schemas.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KVEventBatch,
    Medium,
)
from msgspec import Meta

Engine = Literal["vllm", "sglang"]
"""An engine dialect kvscope understands."""
ENGINES: Final[tuple[Engine, ...]] = get_args(Engine)
_U64_MASK = (1 << 64) - 1
_MEDIUMS: dict[str, Medium] = {
    "GPU": "GPU",
    "CPU": "CPU",
    "CPU_PINNED": "CPU",
    "DISK": "DISK",
    "STORAGE": "DISK",
    "EXTERNAL": "EXTERNAL",
}
RawHash = int | bytes
_NonNeg = Annotated[int, Meta(ge=0)]


def normalize_hash(value: RawHash) -> int:
    """A block hash as an unsigned 64-bit int; bytes map like vLLM's own conversion."""
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & _U64_MASK
    return value & _U64_MASK


def normalize_medium(raw: str | None) -> Medium:
    """The engine's medium name mapped onto kvscope's tiers (None means the device cache)."""
    if raw is None:
        return "GPU"
    return _MEDIUMS.get(raw.upper(), "UNKNOWN")


def event_tier(event: Any) -> str | None:
    """An event's offloading tier: vLLM's `locality` (LOCAL, the tier on the engine's own
    machine, left out) and `ownership` (which secondary tier), joined by `/`; None when
    the engine names neither, so a plain CPU offload stays medium `CPU` alone. Values
    that are not strings are ignored."""
    locality = getattr(event, "locality", None)
    ownership = getattr(event, "ownership", None)
    parts = []
    if isinstance(locality, str) and locality and locality.upper() != "LOCAL":
        parts.append(locality)
    if isinstance(ownership, str) and ownership:
        parts.append(ownership)
    return "/".join(parts) or None


class _MapEvent(msgspec.Struct, tag_field="type", gc=False):
    pass


class _ArrayEvent(msgspec.Struct, array_like=True, tag=True, gc=False):
    pass


_STORED_FIELDS: list[tuple[str, Any, Any] | tuple[str, Any]] = [
    ("block_hashes", list[RawHash]),
    ("parent_block_hash", RawHash | None, None),
    ("token_ids", list[int], []),
    ("block_size", _NonNeg, 0),
    ("lora_id", int | None, None),
    ("medium", str | None, None),
    # vLLM's lora_name, or SGLang's BlockStoredWithMetadata `metadata` map (not kept).
    ("lora_name", str | dict[str, Any] | None, None),
    # vLLM's per-block extra hash keys: only skipped over (Raw: never decoded).
    ("extra_keys", msgspec.Raw, msgspec.Raw()),
    ("group_idx", int | None, None),
    ("kv_cache_spec_kind", msgspec.Raw, msgspec.Raw()),
    ("kv_cache_spec_sliding_window", msgspec.Raw, msgspec.Raw()),
    # vLLM 0.32's offloading tiers: any value is taken, only strings are kept (`event_tier`).
    ("locality", Any, None),
    ("ownership", Any, None),
]
"""BlockStored fields in wire order; both engine shapes share them (array form: by position)."""
_REMOVED_FIELDS: list[tuple[str, Any, Any] | tuple[str, Any]] = [
    ("block_hashes", list[RawHash]),
    ("medium", str | None, None),
    ("group_idx", int | None, None),
    ("locality", Any, None),
    ("ownership", Any, None),
]

_MapStored = msgspec.defstruct("_MapStored", _STORED_FIELDS, bases=(_MapEvent,), tag="BlockStored")
_MapRemoved = msgspec.defstruct(
    "_MapRemoved", _REMOVED_FIELDS, bases=(_MapEvent,), tag="BlockRemoved"
)
_MapCleared = msgspec.defstruct("_MapCleared", [], bases=(_MapEvent,), tag="AllBlocksCleared")
_ArrayStored = msgspec.defstruct(
    "_ArrayStored", _STORED_FIELDS, bases=(_ArrayEvent,), tag="BlockStored"
)
_ArrayRemoved = msgspec.defstruct(
    "_ArrayRemoved", _REMOVED_FIELDS, bases=(_ArrayEvent,), tag="BlockRemoved"
)
_ArrayCleared = msgspec.defstruct("_ArrayCleared", [], bases=(_ArrayEvent,), tag="AllBlocksCleared")


if TYPE_CHECKING:
    # defstruct's classes are values to a type checker; there, an event is of the base class.
    _MapEvents = list[_MapEvent]
    _ArrayEvents = list[_ArrayEvent]
else:
    _MapEvents = list[_MapStored | _MapRemoved | _MapCleared]
    _ArrayEvents = list[_ArrayStored | _ArrayRemoved | _ArrayCleared]


class _ArrayBatchMapEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: _MapEvents
    data_parallel_rank: _NonNeg | None = None


class _ArrayBatchArrayEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: _ArrayEvents
    data_parallel_rank: _NonNeg | None = None


class _MapBatchMapEvents(msgspec.Struct, gc=False):
    ts: float
    events: _MapEvents
    data_parallel_rank: _NonNeg | None = None


class _MapBatchArrayEvents(msgspec.Struct, gc=False):
    ts: float
    events: _ArrayEvents
    data_parallel_rank: _NonNeg | None = None


_BatchShape = (
    _ArrayBatchMapEvents | _MapBatchMapEvents | _ArrayBatchArrayEvents | _MapBatchArrayEvents
)
_VLLM_ORDER: tuple[type[_BatchShape], ...] = (
    _ArrayBatchMapEvents,
    _MapBatchMapEvents,
    _ArrayBatchArrayEvents,
    _MapBatchArrayEvents,
)
_SGLANG_ORDER: tuple[type[_BatchShape], ...] = (
    _ArrayBatchArrayEvents,
    _ArrayBatchMapEvents,
    _MapBatchArrayEvents,
    _MapBatchMapEvents,
)
_DECODERS = {
    "vllm": [msgspec.msgpack.Decoder(t) for t in _VLLM_ORDER],
    "sglang": [msgspec.msgpack.Decoder(t) for t in _SGLANG_ORDER],
}


class _ArrayBatchRawEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: _NonNeg | None = None


class _MapBatchRawEvents(msgspec.Struct, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: _NonNeg | None = None


_RAW_BATCH_TYPES: tuple[type[_ArrayBatchRawEvents | _MapBatchRawEvents], ...] = (
    _ArrayBatchRawEvents,
    _MapBatchRawEvents,
)
_RAW_BATCH_DECODERS = [msgspec.msgpack.Decoder(t) for t in _RAW_BATCH_TYPES]
_EVENT_DECODERS = [
    msgspec.msgpack.Decoder(_MapStored | _MapRemoved | _MapCleared),
    msgspec.msgpack.Decoder(_ArrayStored | _ArrayRemoved | _ArrayCleared),
]
_ANY = msgspec.msgpack.Decoder()
_KNOWN_KINDS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


class EngineBatch(NamedTuple):
    """One decoded engine payload: the batch, and the events kvscope skipped."""

    batch: KVEventBatch
    unknown_events: list[str]
    """Type names of the engine events kvscope does not know (a newer engine's), skipped."""


def decode_engine_batch(
    payload: bytes, engine: str = "vllm", *, keep_token_ids: bool = False
) -> EngineBatch:
    """Normalize one engine ZMQ payload (the msgpack frame) into a `KVEventBatch`.

    An event whose type tag kvscope does not know is skipped and named in
    `unknown_events`; the batch's other events are kept. `keep_token_ids` forwards the
    token ids themselves; by default only their count is kept. Raises `DecodeError` for
    anything else that is not one of the accepted shapes.
    """
    decoders = _DECODERS.get(engine)
    if decoders is None:
        raise DecodeError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    first_error: Exception | None = None
    for decoder in decoders:
        try:
            raw = decoder.decode(payload)
        except MALFORMED as exc:
            if first_error is None:
                first_error = exc
            if not isinstance(exc, msgspec.ValidationError):
                break
            continue
        return EngineBatch(_batch(raw, raw.events, keep_token_ids), [])
    assert first_error is not None  # every decoder failed, the first one set it
    error = DecodeError(f"{engine} payload: {_describe(first_error)}")
    if not isinstance(first_error, msgspec.ValidationError):
        raise error
    return _decode_with_unknown_events(payload, keep_token_ids, error)


def decode_engine_payload(
    payload: bytes, engine: str = "vllm", *, keep_token_ids: bool = False
) -> KVEventBatch:
    """`decode_engine_batch`'s batch alone (events of unknown types skipped)."""
    return decode_engine_batch(payload, engine, keep_token_ids=keep_token_ids).batch


def _batch(raw: Any, events: list[Any], keep_token_ids: bool) -> KVEventBatch:
    return KVEventBatch(
        ts=raw.ts,
        events=[ev for e in events if (ev := normalize_event(e, keep_token_ids)) is not None],
        dp_rank=raw.data_parallel_rank,
    )


def _decode_with_unknown_events(
    payload: bytes, keep_token_ids: bool, error: DecodeError
) -> EngineBatch:
    """Error path: decode event by event, skipping (and naming) events of unknown types.

    Raises `error` unless the batch is valid once those are left out.
    """
    for decoder in _RAW_BATCH_DECODERS:
        try:
            raw = decoder.decode(payload)
        except MALFORMED:
            continue
        events: list[Any] = []
        unknown: list[str] = []
        for raw_event in raw.events:
            event = _decode_event(raw_event)
            if event is not None:
                events.append(event)
                continue
            kind = _kind_of(raw_event)
            if kind is None or kind in _KNOWN_KINDS:
                raise error
            unknown.append(kind)
        return EngineBatch(_batch(raw, events, keep_token_ids), unknown)
    raise error


def _decode_event(raw_event: msgspec.Raw) -> Any:
    for decoder in _EVENT_DECODERS:
        try:
            return decoder.decode(raw_event)
        except MALFORMED:
            continue
    return None


def _kind_of(raw_event: msgspec.Raw) -> str | None:
    """The type tag of an event kvscope could not decode: map `type`, or an array's first item."""
    try:
        value = _ANY.decode(raw_event)
    except MALFORMED:
        return None
    if isinstance(value, dict):
        tag = value.get("type")
    else:
        tag = value[0] if isinstance(value, list) and value else None
    return tag if isinstance(tag, str) else None


def _describe(exc: Exception) -> str:
    if isinstance(exc, msgspec.ValidationError):
        return f"not a KV event batch: {exc}"
    return explain_malformed(exc)


def event_kind(event: Any) -> str:
    """An engine event's type name: its msgspec tag (`BlockStored`, ...), else its class name."""
    tag = getattr(getattr(type(event), "__struct_config__", None), "tag", None)
    return tag if isinstance(tag, str) else type(event).__name__


def normalize_event(event: Any, keep_token_ids: bool = False) -> Event | None:
    """One engine KV event as kvscope's `Event`; None for an event type kvscope does not know.

    Duck-typed on the field names vLLM and SGLang share (`block_hashes`,
    `parent_block_hash`, `token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`,
    `group_idx`), so it takes both the decoded ZMQ payloads and vLLM's in-memory events.
    The optional ones may be missing (None then): vLLM's in-memory events gained `medium`,
    `lora_name` (vllm-project/vllm#27577) and `group_idx` over releases, and `lora_id`
    is deprecated. `keep_token_ids` forwards the token ids themselves; by default only
    their count is kept.
    """
    kind = event_kind(event)
    medium = getattr(event, "medium", None)
    if kind == "BlockStored":
        parent = event.parent_block_hash
        lora_name = getattr(event, "lora_name", None)
        return BlockStored(
            block_hashes=[normalize_hash(h) for h in event.block_hashes],
            parent_block_hash=None if parent is None else normalize_hash(parent),
            block_size=event.block_size,
            token_count=len(event.token_ids),
            medium=normalize_medium(medium),
            medium_raw=medium,
            lora_id=getattr(event, "lora_id", None),
            lora_name=lora_name if isinstance(lora_name, str) else None,
            group_idx=getattr(event, "group_idx", None),
            tier=event_tier(event),
            token_ids=list(event.token_ids) if keep_token_ids else None,
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=[normalize_hash(h) for h in event.block_hashes],
            medium=normalize_medium(medium),
            medium_raw=medium,
            group_idx=getattr(event, "group_idx", None),
            tier=event_tier(event),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None

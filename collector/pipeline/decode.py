"""Decode stage: Kafka record values -> envelopes, sorted by where their rows go.

A record becomes exactly one of: a stream row source (its body belongs to the topic's
stream), a publisher-reported gap (a `Gap` body), or an `ingest_errors` row (anything
that cannot be decoded or does not belong on this topic). Bad records never raise: the
partition must never stall on them.

KV events, the high-volume stream, take a fast path: the same msgpack decoded into
`FlatEvent`s, one struct type for all three events (the wire tag `type` becomes a plain
field), so column building can read each attribute with one list comprehension instead
of branching per event type. Anything the fast path does not accept (Gap bodies, errors)
goes through the full `kvscope.schemas.decode`, which names the problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal, Protocol

import msgspec
from kvscope.schemas import SCHEMA_VERSION, STREAM_BODIES, DecodeError, Gap, Source, decode
from kvscope.schemas.wire import Medium, NonNegInt, UInt64


class RawRecord(Protocol):
    """What the decode stage needs of a Kafka record (aiokafka's ConsumerRecord has it)."""

    offset: int
    key: bytes | None
    value: bytes | None


class FlatEvent(msgspec.Struct, gc=False):
    """Any KV event, flattened: BlockStored's fields with the defaults of the others."""

    type: Literal["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    block_hashes: list[UInt64] = []
    parent_block_hash: UInt64 | None = None
    block_size: NonNegInt = 0
    token_count: NonNegInt = 0
    medium: Medium = "GPU"
    medium_raw: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None


class FlatKVBatch(msgspec.Struct, tag_field="type", tag="KVEvents", gc=False):
    """A `KVEventBatch` whose events are `FlatEvent`s."""

    ts: float
    events: list[FlatEvent]
    dp_rank: NonNegInt | None = None


class FlatKVEnvelope(msgspec.Struct, kw_only=True, gc=False):
    """An `Envelope` carrying a `FlatKVBatch` (same fields, same constraints)."""

    schema: NonNegInt = SCHEMA_VERSION
    source: Source
    epoch: UInt64
    seq: NonNegInt
    ts: float
    body: FlatKVBatch


_flat_kv_decoder = msgspec.msgpack.Decoder(FlatKVEnvelope)


@dataclasses.dataclass
class BadRecord:
    """A record that cannot be stored as stream data, and why."""

    offset: int
    key: bytes
    value: bytes
    reason: str


@dataclasses.dataclass
class Decoded:
    """The decoded records of one topic-partition run, each kept in offset order."""

    offsets: list[int] = dataclasses.field(default_factory=list)
    """Offsets of `envelopes`."""
    envelopes: list[Any] = dataclasses.field(default_factory=list)
    """Envelopes whose body belongs to the topic's stream (`FlatKVEnvelope` for KV events)."""
    records: list[RawRecord] = dataclasses.field(default_factory=list)
    """The records `envelopes` came from (their bytes, should a row turn out unstorable)."""
    gap_offsets: list[int] = dataclasses.field(default_factory=list)
    """Offsets of `gaps`."""
    gaps: list[Any] = dataclasses.field(default_factory=list)
    """Envelopes carrying a publisher `Gap` body."""
    bad: list[BadRecord] = dataclasses.field(default_factory=list)
    """Records for `ingest_errors`."""


def bad_record(record: RawRecord, reason: str) -> BadRecord:
    """The `ingest_errors` entry of `record`."""
    return BadRecord(record.offset, record.key or b"", record.value or b"", reason)


def _fast_kv(value: bytes | None) -> FlatKVEnvelope | None:
    if value is None:
        return None
    try:
        envelope = _flat_kv_decoder.decode(value)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return envelope if envelope.schema <= SCHEMA_VERSION else None


def decode_records(stream: str, records: Iterable[RawRecord]) -> Decoded:
    """Decode `records` of one partition of `stream`'s topic (never raises on bad data)."""
    body_type = STREAM_BODIES[stream]
    fast = stream == "kv-events"
    out = Decoded()
    for record in records:
        value = record.value
        if fast:
            flat = _fast_kv(value)
            if flat is not None:
                out.offsets.append(record.offset)
                out.envelopes.append(flat)
                out.records.append(record)
                continue
        try:
            if value is None:
                raise DecodeError("empty record value (tombstone)")
            envelope = decode(value)
        except DecodeError as exc:
            out.bad.append(bad_record(record, str(exc)))
            continue
        body = envelope.body
        if type(body) is Gap:
            out.gap_offsets.append(record.offset)
            out.gaps.append(envelope)
        elif type(body) is body_type and not fast:
            out.offsets.append(record.offset)
            out.envelopes.append(envelope)
            out.records.append(record)
        elif type(body) is body_type:
            out.bad.append(bad_record(record, "KV batch the columnar decoder rejects"))
        else:
            reason = f"{type(body).__name__} body does not belong on stream {stream}"
            out.bad.append(bad_record(record, reason))
    return out

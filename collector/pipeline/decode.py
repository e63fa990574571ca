"""Decode stage: Kafka record values -> envelopes, sorted by where their rows go.

A record becomes exactly one of: a stream row source (its body belongs to the topic's
stream), a publisher-reported gap (a `Gap` body), or an `ingest_errors` row (anything
that cannot be decoded or does not belong on this topic). Bad records never raise: the
partition must never stall on them.

KV events, the high-volume stream, take a fast path: the same msgpack decoded into
`FlatEvent`s, one struct type for all three events (the wire tag `type` becomes a plain
field), so column building can read each attribute with one list comprehension instead
of branching per event type. Block hashes stay msgpack bytes (`msgspec.Raw`), checked for
the whole poll at once by `kvscope.collector.pipeline.hashes` before any record is routed.
Anything the fast path does not accept (Gap bodies, errors) goes through the full
`kvscope.schemas.decode`, which names the problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Protocol

import msgspec
from kvscope.collector.pipeline import hashes
from kvscope.collector.pipeline.checks import violation
from kvscope.schemas import SCHEMA_VERSION, STREAM_BODIES, DecodeError, Gap, Source, decode
from kvscope.schemas.codec import MALFORMED
from kvscope.schemas.limits import (
    MAX_EVENTS_PER_RECORD,
    MAX_NAME_CHARS,
    MAX_ROWS_PER_RECORD,
    MAX_UINT32,
)
from kvscope.schemas.wire import Medium, NonNegInt, UInt64
from msgspec import Meta

Name = Annotated[str, Meta(max_length=MAX_NAME_CHARS)]
UInt32 = Annotated[int, Meta(ge=0, le=MAX_UINT32)]
Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
MAX_REASON_CHARS = 1000
"""`ingest_errors.reason` keeps at most this many characters."""


class RawRecord(Protocol):
    """What the decode stage needs of a Kafka record (aiokafka's ConsumerRecord has it)."""

    @property
    def offset(self) -> int:
        """The record's offset in its partition."""

    @property
    def key(self) -> bytes | None:
        """The record key."""

    @property
    def value(self) -> bytes | None:
        """The record value (None: a tombstone)."""


class FlatEvent(msgspec.Struct, gc=False):
    """Any KV event, flattened: BlockStored's fields with the defaults of the others.

    Its constraints are the collector's per-event limits (`kvscope.collector.pipeline.checks`),
    checked in C while decoding: the columns they fill can then never overflow. The block
    hashes are the msgpack bytes of their array: `decode_records` checks them with
    `hashes.check` (at most `MAX_ROWS_PER_RECORD` per event) before routing the record.
    """

    type: Literal["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    block_hashes: msgspec.Raw = hashes.EMPTY
    parent_block_hash: UInt64 | None = None
    block_size: UInt32 = 0
    token_count: UInt32 = 0
    medium: Medium = "GPU"
    medium_raw: Name | None = None
    lora_name: Name | None = None
    group_idx: Int32 | None = None
    tier: Name | None = None


class FlatKVBatch(msgspec.Struct, tag_field="type", tag="KVEvents", gc=False):
    """A `KVEventBatch` whose events are `FlatEvent`s."""

    ts: float
    events: Annotated[list[FlatEvent], Meta(max_length=MAX_EVENTS_PER_RECORD)]
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
    kv_hashes: hashes.Hashes | None = None
    """The block hashes of `envelopes` (KV events), parsed while checking them."""


def bad_record(record: RawRecord, reason: str) -> BadRecord:
    """The `ingest_errors` entry of `record` (the reason cut to `MAX_REASON_CHARS`)."""
    return BadRecord(
        record.offset, record.key or b"", record.value or b"", reason[:MAX_REASON_CHARS]
    )


def _fast_kv(value: bytes | None) -> FlatKVEnvelope | str | Exception:
    """The flat envelope of a KV record, why the fast path does not take it, or the bug."""
    if value is None:
        return "empty record value (tombstone)"
    try:
        envelope = _flat_kv_decoder.decode(value)
    except msgspec.ValidationError as exc:
        return str(exc)
    except MALFORMED:
        return "malformed"
    except Exception as exc:  # a bug must not stall the partition: keep the record
        return exc
    return envelope if envelope.schema <= SCHEMA_VERSION else "newer schema"


def _fast_kv_records(records: list[RawRecord]) -> tuple[list[Any], hashes.Checked | None]:
    """`_fast_kv` of each record, with the hash arrays of all of them checked at once."""
    flats = [_fast_kv(record.value) for record in records]
    at = [i for i, flat in enumerate(flats) if type(flat) is FlatKVEnvelope]
    try:
        checked = hashes.check([flats[i] for i in at], MAX_ROWS_PER_RECORD)
    except Exception:  # a bug must not stall the partition, nor cost the other records
        return [_checked_alone(flat) for flat in flats], None
    for j, problem in checked.problems.items():
        flats[at[j]] = problem
    return flats, checked


def _checked_alone(flat: Any) -> Any:
    """`flat` checked on its own: itself, why its hashes are not acceptable, or the bug."""
    if type(flat) is not FlatKVEnvelope:
        return flat
    try:
        return hashes.check([flat], MAX_ROWS_PER_RECORD).problems.get(0, flat)
    except Exception as exc:  # a bug must not stall the partition: keep the record
        return exc


def decode_records(stream: str, records: Iterable[RawRecord]) -> Decoded:
    """Decode `records` of one partition of `stream`'s topic (never raises on bad data)."""
    body_type = STREAM_BODIES[stream]
    records = list(records)
    flats, checked = (
        _fast_kv_records(records) if stream == "kv-events" else ([""] * len(records), None)
    )
    out = Decoded()
    for record, flat in zip(records, flats, strict=True):
        try:
            if isinstance(flat, Exception):
                raise flat
            if isinstance(flat, str):
                _full(out, stream, record, body_type, flat)
            else:
                _route(out, stream, record, flat)
        except Exception as exc:  # a bug must not stall the partition: keep the record
            out.bad.append(bad_record(record, f"cannot decode: {type(exc).__name__}: {exc}"))
    if checked is not None:
        out.kv_hashes = checked.of(out.envelopes)
    return out


def _full(out: Decoded, stream: str, record: RawRecord, body_type: type, rejected: str) -> None:
    """Route `record` through the full decoder, which names what is wrong with it."""
    if record.value is None:
        out.bad.append(bad_record(record, "empty record value (tombstone)"))
        return
    try:
        envelope = decode(record.value)
    except DecodeError as exc:
        out.bad.append(bad_record(record, str(exc)))
        return
    body = envelope.body
    if type(body) is body_type and rejected:
        out.bad.append(bad_record(record, f"KV batch over a limit or out of range: {rejected}"))
    elif type(body) is body_type or type(body) is Gap:
        _route(out, stream, record, envelope)
    else:
        reason = f"{type(body).__name__} body does not belong on stream {stream}"
        out.bad.append(bad_record(record, reason))


def _route(out: Decoded, stream: str, record: RawRecord, envelope: Any) -> None:
    """File a decoded envelope as data, gap or (over a limit) bad record."""
    problem = violation(stream, envelope, len(record.value or b""))
    if problem:
        out.bad.append(bad_record(record, f"over a limit: {problem}"))
    elif type(envelope.body) is Gap:
        out.gap_offsets.append(record.offset)
        out.gaps.append(envelope)
    else:
        out.offsets.append(record.offset)
        out.envelopes.append(envelope)
        out.records.append(record)

"""Decode stage: Kafka record values -> envelopes, sorted by where their rows go.

A record becomes exactly one of: a stream row source (its body belongs to the topic's
stream), a publisher-reported gap (a `Gap` body), or an `ingest_errors` row (anything
that cannot be decoded or does not belong on this topic). Bad records never raise: the
partition must never stall on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from kvscope.schemas import STREAM_BODIES, DecodeError, Envelope, Gap, decode


class RawRecord(Protocol):
    """What the decode stage needs of a Kafka record (aiokafka's ConsumerRecord has it)."""

    offset: int
    key: bytes | None
    value: bytes | None


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
    envelopes: list[Envelope] = dataclasses.field(default_factory=list)
    """Envelopes whose body belongs to the topic's stream."""
    gap_offsets: list[int] = dataclasses.field(default_factory=list)
    """Offsets of `gaps`."""
    gaps: list[Envelope] = dataclasses.field(default_factory=list)
    """Envelopes carrying a publisher `Gap` body."""
    bad: list[BadRecord] = dataclasses.field(default_factory=list)
    """Records for `ingest_errors`."""


def decode_records(stream: str, records: Iterable[RawRecord]) -> Decoded:
    """Decode `records` of one partition of `stream`'s topic (never raises on bad data)."""
    body_type = STREAM_BODIES[stream]
    out = Decoded()
    for record in records:
        value = record.value
        try:
            if value is None:
                raise DecodeError("empty record value (tombstone)")
            envelope = decode(value)
        except DecodeError as exc:
            out.bad.append(BadRecord(record.offset, record.key or b"", value or b"", str(exc)))
            continue
        body = envelope.body
        if type(body) is body_type:
            out.offsets.append(record.offset)
            out.envelopes.append(envelope)
        elif type(body) is Gap:
            out.gap_offsets.append(record.offset)
            out.gaps.append(envelope)
        else:
            reason = f"{type(body).__name__} body does not belong on stream {stream}"
            out.bad.append(BadRecord(record.offset, record.key or b"", value, reason))
    return out

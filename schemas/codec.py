"""Encode and decode kvscope envelopes (msgpack), with errors that say what is wrong."""

from __future__ import annotations

import re

import msgspec

from kvscope.schemas.errors import DecodeError
from kvscope.schemas.wire import SCHEMA_VERSION, Envelope


class _Header(msgspec.Struct):
    """Just enough of an envelope to tell its schema version apart."""

    schema: int = SCHEMA_VERSION


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)
_header_decoder = msgspec.msgpack.Decoder(_Header)
_TAG_ERROR = re.compile(r"Invalid value '([^']*)' - at `\$\.body\.type`")


def encode(envelope: Envelope) -> bytes:
    """Serialize an envelope to the bytes of one Kafka record value."""
    return _encoder.encode(envelope)


def decode(data: bytes) -> Envelope:
    """Parse one Kafka record value; raise `DecodeError` naming the problem."""
    try:
        envelope = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise DecodeError(_explain_invalid(data, exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(_explain_malformed(exc)) from None
    if envelope.schema > SCHEMA_VERSION:
        raise DecodeError(_newer_schema(envelope.schema))
    return envelope


def _newer_schema(schema: int) -> str:
    return f"newer schema {schema}: this kvscope reads up to schema {SCHEMA_VERSION}; upgrade it"


def _explain_malformed(exc: msgspec.DecodeError) -> str:
    text = str(exc)
    if "truncated" in text:
        return "truncated record: the msgpack data ends early"
    return f"not msgpack: {text}"


def _explain_invalid(data: bytes, exc: msgspec.ValidationError) -> str:
    try:
        schema = _header_decoder.decode(data).schema
    except (msgspec.ValidationError, msgspec.DecodeError):
        schema = SCHEMA_VERSION
    if schema > SCHEMA_VERSION:
        return _newer_schema(schema)
    text = str(exc)
    unknown_tag = _TAG_ERROR.search(text)
    if unknown_tag:
        return f"unknown body type {unknown_tag.group(1)!r}"
    return f"invalid envelope: {text}"

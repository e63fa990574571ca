"""Encode and decode kvscope envelopes (msgpack), with errors that say what is wrong."""

from __future__ import annotations

import re

import msgspec
from kvscope.schemas.errors import DecodeError
from kvscope.schemas.wire import SCHEMA_VERSION, Envelope

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)
_any_decoder = msgspec.msgpack.Decoder()
_TAG_ERROR = re.compile(r"Invalid value '([^']*)' - at `\$\.body\.type`")
_AT_FIELD = re.compile(r"^(.*) - at `\$\.?(.*)`$")
MALFORMED = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What msgspec raises for bytes that are not (sane) msgpack: bad bytes, bad UTF-8, nesting
deeper than the interpreter's recursion limit."""


def encode(envelope: Envelope) -> bytes:
    """Serialize an envelope to the bytes of one Kafka record value."""
    return _encoder.encode(envelope)


def decode(data: bytes) -> Envelope:
    """Parse one Kafka record value; raise `DecodeError` naming the problem."""
    try:
        envelope = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise DecodeError(_explain_invalid(data, exc)) from None
    except MALFORMED as exc:
        raise DecodeError(explain_malformed(exc)) from None
    if envelope.schema > SCHEMA_VERSION:
        raise DecodeError(_newer_schema(envelope.schema))
    return envelope


def _newer_schema(schema: int) -> str:
    return f"newer schema {schema}: this kvscope reads up to schema {SCHEMA_VERSION}; upgrade it"


def explain_malformed(exc: Exception) -> str:
    """Say why bytes are not msgpack (one of the `MALFORMED` errors)."""
    text = str(exc)
    if isinstance(exc, UnicodeDecodeError) or "invalid utf-8" in text.lower():
        # msgspec up to 0.22 raises UnicodeDecodeError; 0.23 a DecodeError saying so.
        return f"not msgpack: a string is not valid UTF-8 ({text})"
    if isinstance(exc, RecursionError):
        return "not msgpack: nested too deeply"
    if "truncated" in text:
        return "truncated: the msgpack data ends early"
    return f"not msgpack: {text}"


def _explain_invalid(data: bytes, exc: msgspec.ValidationError) -> str:
    # Error path only: a schemaless decode tells malformed bytes, a non-map record
    # and a newer schema apart before blaming one field.
    try:
        value = _any_decoder.decode(data)
    except MALFORMED as malformed:
        return explain_malformed(malformed)
    if not isinstance(value, dict):
        return f"not an envelope: the record is a msgpack {type(value).__name__}, not a map"
    schema = value.get("schema", SCHEMA_VERSION)
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        return _newer_schema(schema)
    text = str(exc)
    unknown_tag = _TAG_ERROR.search(text)
    if unknown_tag:
        return f"unknown body type {unknown_tag.group(1)!r}"
    at_field = _AT_FIELD.match(text)
    if at_field:
        return f"wrong type or value at field `{at_field.group(2)}`: {at_field.group(1)}"
    return f"invalid envelope: {text}"

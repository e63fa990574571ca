"""The collector's copies of the record types stay tied to the wire structs and the tables.

One record type is spelled in several places: `schemas/wire.py` (the contract),
`decode.FlatEvent` / `FlatKVBatch` / `FlatKVEnvelope` (the fast KV decode), `FLAT_COLUMNS`
(column <- body attribute of the one-row streams) and the migrations (the tables). A field
added to the wire must be taken or knowingly dropped by the collector; a column must exist.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from kvscope.collector.pipeline.checks import FLAT_COLUMNS
from kvscope.collector.pipeline.decode import FlatEvent, FlatKVBatch, FlatKVEnvelope
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.tables import STREAM_TABLES
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Envelope,
    KVEventBatch,
    Stream,
)
from kvscope.schemas.streams import STREAM_BODIES

WIRE_EVENTS = (BlockStored, BlockRemoved, AllBlocksCleared)
DROPPED_EVENT_FIELDS = {"token_ids", "lora_id"}
"""Wire event fields the collector does not store (token ids are opt-in payload and only
counted; a LoRA is kept by name)."""


def _fields(struct: type) -> dict[str, Any]:
    """Field name -> default (msgspec.NODEFAULT when required) of a msgspec Struct."""
    info = msgspec.structs.fields(struct)
    return {f.name: f.default for f in info}


def test_flat_event_takes_every_wire_event_field_but_the_dropped_ones() -> None:
    wire: set[str] = set().union(*(_fields(e) for e in WIRE_EVENTS))
    flat = set(_fields(FlatEvent)) - {"type"}
    assert flat <= wire, f"FlatEvent fields not on the wire: {flat - wire}"
    assert wire - flat == DROPPED_EVENT_FIELDS


def test_flat_event_defaults_are_the_wire_defaults() -> None:
    flat = _fields(FlatEvent)
    for event in WIRE_EVENTS:
        for name, default in _fields(event).items():
            if name in flat and name != "block_hashes" and default is not msgspec.NODEFAULT:
                assert flat[name] == default, (event.__name__, name)


def test_flat_event_type_tags_are_the_wire_tags() -> None:
    tags = {e.__struct_config__.tag for e in WIRE_EVENTS}
    allowed = set(typing.get_args(typing.get_type_hints(FlatEvent)["type"]))
    assert tags == allowed


@pytest.mark.parametrize(
    ("flat", "wire"), [(FlatKVBatch, KVEventBatch), (FlatKVEnvelope, Envelope)]
)
def test_flat_batch_and_envelope_have_the_wire_fields(flat: type, wire: type) -> None:
    assert set(_fields(flat)) == set(_fields(wire))
    assert flat.__struct_config__.tag == wire.__struct_config__.tag


def test_a_wire_batch_decodes_as_the_flat_batch_with_the_same_values() -> None:
    batch = KVEventBatch(
        ts=1.5,
        dp_rank=3,
        events=[
            BlockStored(
                block_hashes=[2**64 - 1, 7],
                parent_block_hash=9,
                block_size=16,
                token_count=32,
                medium="CPU",
                medium_raw="CPU_PINNED",
                lora_name="a",
                group_idx=1,
                tier="DISK/REMOTE",
            ),
            BlockRemoved(block_hashes=[7], medium="CPU"),
            AllBlocksCleared(),
        ],
    )
    flat = msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=FlatKVBatch)
    assert (flat.ts, flat.dp_rank, len(flat.events)) == (1.5, 3, 3)
    for wire_event, flat_event in zip(batch.events, flat.events, strict=True):
        assert flat_event.type == type(wire_event).__name__
        for name in set(_fields(type(wire_event))) - DROPPED_EVENT_FIELDS - {"block_hashes"}:
            assert getattr(flat_event, name) == getattr(wire_event, name), name
        hashes = getattr(wire_event, "block_hashes", [])
        assert msgspec.msgpack.decode(flat_event.block_hashes) == hashes


@pytest.mark.parametrize("stream", sorted(FLAT_COLUMNS))
def test_flat_columns_read_every_body_field(stream: str) -> None:
    attributes = [attr for _, attr, _ in FLAT_COLUMNS[stream]]
    assert len(attributes) == len(set(attributes))
    assert set(attributes) == set(_fields(STREAM_BODIES[stream]))


def test_every_stream_has_its_columns_or_is_the_kv_stream() -> None:
    assert set(FLAT_COLUMNS) | {Stream.KV_EVENTS} == set(Stream)
    assert set(STREAM_TABLES) == set(Stream)


def test_flat_columns_exist_in_the_migrated_tables(clickhouse: Any, clickhouse_url: str) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    for stream, columns in FLAT_COLUMNS.items():
        table = STREAM_TABLES[stream]
        names = {row[0] for row in clickhouse.query(f"DESCRIBE TABLE {table}").result_rows}
        missing = {column for column, _, _ in columns} - names
        assert missing == set(), (table, missing)

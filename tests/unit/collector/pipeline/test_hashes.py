"""Block hashes read straight from msgpack bytes: what msgspec reads, in every encoding.

The reference everywhere is msgspec decoding the same bytes as a list of ints (the path
the collector took before hashes stayed `msgspec.Raw`): the same values for every integer
width and array header, and the same rejections, with the same reasons, for the rest.
"""

from __future__ import annotations

import random
from typing import Annotated, Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvscope.collector.pipeline import columns, hashes
from kvscope.collector.pipeline.checks import kv_rows, violation
from kvscope.collector.pipeline.decode import (
    FlatEvent,
    FlatKVBatch,
    FlatKVEnvelope,
    _flat_kv_decoder,
    decode_records,
)
from kvscope.schemas import DecodeError, decode, encode
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD
from kvscope.schemas.wire import UInt64
from msgspec import Meta

WIDTHS: dict[str, tuple[int, int, int, bool]] = {
    "fixint": (-1, 0, 0x7F, False),
    "uint8": (0xCC, 1, 2**8 - 1, False),
    "uint16": (0xCD, 2, 2**16 - 1, False),
    "uint32": (0xCE, 4, 2**32 - 1, False),
    "uint64": (0xCF, 8, 2**64 - 1, False),
    "int8": (0xD0, 1, 2**7 - 1, True),
    "int16": (0xD1, 2, 2**15 - 1, True),
    "int32": (0xD2, 4, 2**31 - 1, True),
    "int64": (0xD3, 8, 2**63 - 1, True),
}
"""msgpack integer encodings: marker (-1: the byte is the value), value bytes, largest
non-negative value, signed. msgspec writes the smallest unsigned one; others are valid too."""
HEADERS = ("fixarray", "array16", "array32")


def _int(value: int, width: str) -> bytes:
    """`value` encoded as a msgpack int of `width` (which must hold it)."""
    marker, size, _, signed = WIDTHS[width]
    if marker < 0:
        return (value & 0xFF).to_bytes(1, "big")
    return bytes([marker]) + value.to_bytes(size, "big", signed=signed)


def _array(items: list[bytes], header: str) -> bytes:
    """A msgpack array of the encoded `items` with the given header kind."""
    n = len(items)
    if header == "fixarray":
        assert n < 16, "a fixarray holds at most 15 elements"
        head = bytes([0x90 | n])
    else:
        head = (
            b"\xdc" + n.to_bytes(2, "big")
            if header == "array16"
            else b"\xdd" + n.to_bytes(4, "big")
        )
    return head + b"".join(items)


def _headers_for(n: int) -> list[str]:
    return list(HEADERS) if n < 16 else list(HEADERS[1:])


def _reference(raw: bytes, max_length: int = MAX_ROWS_PER_RECORD) -> list[int] | str:
    """msgspec's list of hashes in `raw`, or its error."""
    try:
        return msgspec.msgpack.decode(
            raw, type=Annotated[list[UInt64], Meta(max_length=max_length)]
        )
    except msgspec.ValidationError as exc:
        return str(exc)


def _assert_like_msgspec(raws: list[bytes], max_length: int = MAX_ROWS_PER_RECORD) -> None:
    parsed = hashes.parse([msgspec.Raw(r) for r in raws], max_length)
    expected = [_reference(r, max_length) for r in raws]
    errors = {i: e for i, e in enumerate(expected) if isinstance(e, str)}
    lists = [[] if isinstance(e, str) else e for e in expected]
    assert parsed.errors == errors
    assert parsed.counts.tolist() == [len(v) for v in lists]
    assert parsed.values.dtype == "uint64"
    assert parsed.values.tolist() == [h for v in lists for h in v]


encoded_ints = st.sampled_from(list(WIDTHS)).flatmap(
    lambda width: st.integers(0, WIDTHS[width][2]).map(lambda v: _int(v, width))
)
raw_arrays = st.lists(encoded_ints, max_size=20).flatmap(
    lambda items: st.sampled_from(_headers_for(len(items))).map(lambda h: _array(items, h))
)


@settings(max_examples=150, deadline=None)
@given(st.lists(raw_arrays, max_size=12))
def test_any_mix_of_widths_and_headers_reads_as_msgspec_does(raws: list[bytes]) -> None:
    _assert_like_msgspec(raws)
    assert [hashes.count(msgspec.Raw(r)) for r in raws] == [len(_reference(r)) for r in raws]


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("n", [0, 1, 2, 15])
def test_every_width_and_header_alone_and_between_uint64_arrays(
    width: str, header: str, n: int
) -> None:
    top = WIDTHS[width][2]
    values = [(0, top, top // 2, 1)[i % 4] for i in range(n)]
    array = _array([_int(v, width) for v in values], header)
    uint64s = _array([_int(2**64 - 1 - i, "uint64") for i in range(3)], "fixarray")
    _assert_like_msgspec([array])
    _assert_like_msgspec([uint64s, array, uint64s, array])


@pytest.mark.parametrize(
    ("n", "header"), [(16, "array16"), (16, "array32"), (65_535, "array16"), (65_536, "array32")]
)
def test_long_arrays_of_uint64_and_of_mixed_widths(n: int, header: str) -> None:
    rng = random.Random(n)
    uint64s = [_int(rng.getrandbits(64) | 2**32, "uint64") for _ in range(n)]
    mixed = [_int(rng.randrange(WIDTHS[w][2] + 1), w) for w in rng.choices(list(WIDTHS), k=n)]
    _assert_like_msgspec([_array(uint64s, header), _array(mixed, header), b"\x90"])


def _float64(value: float) -> bytes:
    return msgspec.msgpack.encode(value)


BAD_ELEMENTS = {
    "negative fixint": _int(-1, "fixint"),
    "negative int8": _int(-1, "int8"),
    "negative int64 (9 bytes, like a uint64)": _int(-(2**63), "int64"),
    "float64 (9 bytes, like a uint64)": _float64(1.5),
    "float32": b"\xca" + bytes(4),
    "nil": b"\xc0",
    "true": b"\xc3",
    "str": b"\xa1x",
    "bin": b"\xc4\x01\x00",
    "nested array": b"\x91\x01",
    "map": b"\x80",
    "ext": b"\xd4\x01\x00",
}
NOT_ARRAYS = {
    "int": b"\x05",
    "uint64": _int(2**64 - 1, "uint64"),
    "str": b"\xa3abc",
    "map": b"\x81\xa1k\x01",
    "nil": b"\xc0",
    "float": _float64(2.0),
}


def _bad_arrays() -> dict[str, bytes]:
    """Arrays msgspec rejects: not arrays, or one bad element at the start, middle or end."""
    good = [_int(2**64 - 1 - i, "uint64") for i in range(4)]
    out = {f"not an array: {name}": raw for name, raw in NOT_ARRAYS.items()}
    for name, element in BAD_ELEMENTS.items():
        for at in (0, 2, 4):
            items = [*good[:at], element, *good[at:]]
            out[f"{name} at {at}"] = _array(items, "fixarray")
    return out


BAD_ARRAYS = _bad_arrays()


def _too_long(n: int, width: str) -> bytes:
    return _array([_int(WIDTHS[width][2], width)] * n, "array32")


@pytest.mark.parametrize(
    "bad",
    [*BAD_ARRAYS.values(), _too_long(5, "uint64"), _too_long(5, "fixint")],
    ids=[*BAD_ARRAYS, "too long uint64", "too long fixint"],
)
def test_what_msgspec_rejects_is_rejected_with_its_reason(bad: bytes) -> None:
    good = _array([_int(2**63 + i, "uint64") for i in range(3)], "fixarray")
    small = _array([_int(i, "fixint") for i in range(3)], "fixarray")
    exactly = _array([_int(2**64 - 1, "uint64")] * 4, "array16")
    _assert_like_msgspec([good, bad, small, exactly, good], max_length=4)


def _envelope_map(events: list[dict[str, Any]], seq: int = 0, **source: Any) -> dict[str, Any]:
    return {
        "schema": 1,
        "source": {"instance": "a", **source},
        "epoch": 1,
        "seq": seq,
        "ts": 1000.0 + seq,
        "body": {"type": "KVEvents", "ts": 1000.0 + seq, "events": events},
    }


class _Record:
    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset = offset
        self.key = b"a/0"
        self.value = value


def _records(values: list[bytes]) -> list[_Record]:
    return [_Record(i, v) for i, v in enumerate(values)]


def _table(values: list[bytes]) -> pa.Table:
    decoded = decode_records("kv-events", _records(values))
    assert not decoded.bad
    table, rejects = columns.rows_and_rejects("kv-events", decoded, "t", 0)
    assert table is not None and not rejects
    return table


def _event(rng: random.Random, kind: str, raw: bytes) -> dict[str, Any]:
    event: dict[str, Any] = {"type": kind, "block_hashes": msgspec.Raw(raw)}
    if kind == "BlockStored":
        event.update(block_size=4, token_count=rng.randrange(40), parent_block_hash=7)
    return event


def _canonical(value: bytes) -> bytes:
    """The same envelope as kvscope's own encoder writes it (smallest widths)."""
    return encode(decode(value))


@pytest.mark.parametrize("seed", range(12))
def test_records_of_any_widths_make_the_table_their_canonical_encoding_makes(seed: int) -> None:
    rng = random.Random(seed)
    values = []
    for seq in range(rng.randrange(1, 6)):
        events = []
        for _ in range(rng.randrange(0, 5)):
            kind = rng.choice(["BlockStored", "BlockRemoved", "AllBlocksCleared"])
            n = rng.choice([0, 1, 3, 15, 16, 40]) if kind != "AllBlocksCleared" else 0
            widths = rng.choices(list(WIDTHS), k=n)
            items = [_int(rng.randrange(WIDTHS[w][2] + 1), w) for w in widths]
            events.append(_event(rng, kind, _array(items, rng.choice(_headers_for(n)))))
        values.append(msgspec.msgpack.encode(_envelope_map(events, seq)))
    table = _table(values)
    assert table.equals(_table([_canonical(v) for v in values]))
    expected = [
        h for v in values for ev in decode(v).body.events for h in getattr(ev, "block_hashes", [0])
    ]
    assert table.column("block_hash").to_pylist() == expected


@pytest.mark.parametrize(
    "hashes_on_the_wire", [b"\x90", b"\x93\x01\x02\x03", b"\x91\xcf" + bytes(8)]
)
def test_all_blocks_cleared_makes_one_row_of_hash_zero_whatever_hashes_it_carries(
    hashes_on_the_wire: bytes,
) -> None:
    rng = random.Random(0)
    events = [
        _event(rng, "BlockRemoved", _array([_int(9, "uint64")], "fixarray")),
        _event(rng, "AllBlocksCleared", hashes_on_the_wire),
        _event(rng, "BlockStored", _array([_int(5, "fixint")] * 2, "array16")),
    ]
    table = _table([msgspec.msgpack.encode(_envelope_map(events))])
    assert table.column("block_hash").to_pylist() == [9, 0, 5, 5]
    assert table.column("event").to_pylist() == [2, 3, 1, 1]


class _ListEvent(FlatEvent, gc=False):
    """`FlatEvent` with its hashes as msgspec decodes them into a list (the reference)."""

    block_hashes: Annotated[list[UInt64], Meta(max_length=MAX_ROWS_PER_RECORD)] = msgspec.field(
        default_factory=list
    )


class _ListBatch(FlatKVBatch, tag="KVEvents"):
    events: list[_ListEvent]


class _ListEnvelope(FlatKVEnvelope):
    body: _ListBatch


def _reference_reason(value: bytes) -> str | None:
    """The reason the decode stage gave when msgspec decoded hashes into lists (None: kept)."""
    try:
        msgspec.msgpack.decode(value, type=_ListEnvelope)
    except msgspec.ValidationError as exc:
        try:
            decode(value)
        except DecodeError as full:
            return str(full)
        return f"KV batch over a limit or out of range: {exc}"
    return None


OVER_THE_LIMIT = {
    f"{MAX_ROWS_PER_RECORD + 1} {width}": _too_long(MAX_ROWS_PER_RECORD + 1, width)
    for width in ("fixint", "uint64")
}


@pytest.mark.parametrize("name", [*BAD_ARRAYS, *OVER_THE_LIMIT])
@pytest.mark.parametrize("kind", ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
def test_a_bad_hash_array_sends_its_record_to_ingest_errors_with_the_same_reason(
    name: str, kind: str
) -> None:
    rng = random.Random(1)
    bad = {**BAD_ARRAYS, **OVER_THE_LIMIT}[name]
    good = _array([_int(2**64 - 2, "uint64")] * 2, "fixarray")
    events = [_event(rng, "BlockStored", good), _event(rng, kind, bad)]
    values = [
        msgspec.msgpack.encode(_envelope_map([_event(rng, "BlockRemoved", good)], 0)),
        msgspec.msgpack.encode(_envelope_map(events, 1)),
        msgspec.msgpack.encode(_envelope_map([_event(rng, "BlockRemoved", good)], 2)),
    ]
    decoded = decode_records("kv-events", _records(values))
    expected = _reference_reason(values[1])
    assert expected is not None
    assert [(b.offset, b.reason) for b in decoded.bad] == [(1, expected)]
    assert "block_hashes" in expected
    table, _ = columns.rows_and_rejects("kv-events", decoded, "t", 0)
    assert table is not None
    assert table.column("seq").to_pylist() == [0, 0, 2, 2]
    assert table.column("block_hash").to_pylist() == [2**64 - 2] * 4


@pytest.mark.parametrize(
    ("sizes", "header"),
    [((70_000,), "array32"), ((70_000, 30_000), "array32"), ((60_000, 40_001), "array16")],
)
def test_rows_of_long_arrays_are_counted_against_the_record_limit(
    sizes: tuple[int, ...], header: str
) -> None:
    rng = random.Random(2)
    events = [
        _event(rng, "BlockRemoved", _array([_int(i % 200, "uint8")] * n, header))
        for i, n in enumerate(sizes)
    ]
    value = msgspec.msgpack.encode(_envelope_map(events))
    envelope = _flat_kv_decoder.decode(value)
    assert kv_rows(envelope.body) == sum(sizes)
    problem = violation("kv-events", envelope, len(value))
    decoded = decode_records("kv-events", _records([value]))
    if sum(sizes) > MAX_ROWS_PER_RECORD:
        assert problem == f"KV batch of {sum(sizes)} rows (limit {MAX_ROWS_PER_RECORD} per record)"
        assert [b.reason for b in decoded.bad] == [f"over a limit: {problem}"]
    else:
        assert problem is None and not decoded.bad
        table, _ = columns.rows_and_rejects("kv-events", decoded, "t", 0)
        assert table is not None and table.num_rows == sum(sizes)


def test_hashes_parsed_while_decoding_are_those_of_the_records_kept() -> None:
    rng = random.Random(3)
    values = []
    for seq in range(6):
        hashes_ = [_int(rng.getrandbits(64), "uint64") for _ in range(seq + 1)]
        source = {"dp_rank": 70_000} if seq in (1, 4) else {}
        event = _event(rng, "BlockStored", _array(hashes_, "fixarray"))
        values.append(msgspec.msgpack.encode(_envelope_map([event], seq, **source)))
    decoded = decode_records("kv-events", _records(values))
    assert [b.offset for b in decoded.bad] == [1, 4]
    assert decoded.kv_hashes is not None
    reparsed = columns.kv_block_events(decoded.envelopes, decoded.offsets, "t", 0)
    table, _ = columns.rows_and_rejects("kv-events", decoded, "t", 0)
    assert table is not None and table.equals(reparsed)
    assert table.column("seq").to_pylist() == [0] + [2] * 3 + [3] * 4 + [5] * 6


def test_a_bug_in_the_batch_check_costs_only_the_record_it_is_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake: `hashes.parse` fails on one poisoned array (no real input makes it raise)."""
    poison = _array([_int(4242, "uint16")], "fixarray")
    real = hashes.parse

    def failing(raws: Any, max_length: int) -> hashes.Hashes:
        if any(bytes(r) == poison for r in raws):
            raise RuntimeError("injected")
        return real(raws, max_length)

    monkeypatch.setattr(hashes, "parse", failing)
    rng = random.Random(4)
    values = [
        msgspec.msgpack.encode(_envelope_map([_event(rng, "BlockRemoved", raw)], seq))
        for seq, raw in enumerate([b"\x91\x01", poison, b"\x92\x02\x03"])
    ]
    decoded = decode_records("kv-events", _records(values))
    assert [(b.offset, b.reason) for b in decoded.bad] == [
        (1, "cannot decode: RuntimeError: injected")
    ]
    assert decoded.kv_hashes is None
    table, _ = columns.rows_and_rejects("kv-events", decoded, "t", 0)
    assert table is not None and table.column("block_hash").to_pylist() == [1, 2, 3]

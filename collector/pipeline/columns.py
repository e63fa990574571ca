"""Column building: decoded envelopes of one partition -> pyarrow tables, one per ClickHouse table.

Vectorized per record batch: one pass over records (and, for KV events, over events)
fills plain Python lists, block hashes are read from their msgpack bytes for the whole
batch at once (`kvscope.collector.pipeline.hashes`), and everything per
row — repeating record and event fields, positions, parent hashes, tokens per block —
is computed with numpy. No dict is built per row. String columns that ClickHouse
stores as LowCardinality go out as Arrow dictionaries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kvscope.collector.pipeline import hashes
from kvscope.collector.pipeline.checks import FLAT_COLUMNS
from kvscope.collector.pipeline.decode import BadRecord, Decoded, FlatKVEnvelope, bad_record
from kvscope.collector.pipeline.gaps import SeqGap
from kvscope.schemas import Envelope, Gap
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD

MAX_ERROR_VALUE = 1024 * 1024
"""`ingest_errors.value` keeps at most this many bytes (`value_size` keeps the full size)."""
TS_TYPE = pa.timestamp("us", tz="UTC")
_EVENT_CODES = {"BlockStored": 1, "BlockRemoved": 2, "AllBlocksCleared": 3}


def _dict(values: Sequence[str] | pa.Array) -> pa.Array:
    """A LowCardinality-friendly dictionary array of strings."""
    array = values if isinstance(values, pa.Array) else pa.array(values, pa.string())
    return array.dictionary_encode()


def _constant(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), pa.array([value], pa.string()))


def seconds_to_ts(seconds: Sequence[float] | np.ndarray) -> pa.Array:
    """Float seconds since the epoch -> Arrow microsecond UTC timestamps."""
    micros = np.rint(np.asarray(seconds, np.float64) * 1e6).astype(np.int64)
    return pa.array(micros, TS_TYPE)


def _source_columns(
    envelopes: Sequence[Any], offsets: Sequence[int], topic: str, partition: int
) -> dict[str, Any]:
    """Per-record source and Kafka-position columns (numpy arrays or Arrow dictionaries)."""
    sources = [e.source for e in envelopes]
    n = len(envelopes)
    return {
        "instance": _dict([s.instance for s in sources]),
        "dp_rank": np.fromiter((s.dp_rank for s in sources), np.uint16, n),
        "model": _dict([s.model for s in sources]),
        "role": _dict([s.role for s in sources]),
        "engine": _dict([s.engine for s in sources]),
        "epoch": np.fromiter((e.epoch for e in envelopes), np.uint64, n),
        "seq": np.fromiter((e.seq for e in envelopes), np.uint64, n),
        "ts": seconds_to_ts(np.fromiter((e.ts for e in envelopes), np.float64, n)),
        "_topic": _constant(topic, n),
        "_partition": np.full(n, partition, np.uint32),
        "_offset": np.asarray(offsets, np.uint64),
    }


def _repeat(columns: dict[str, Any], counts: np.ndarray) -> dict[str, Any]:
    """Repeat per-record columns onto rows (record i has `counts[i]` rows)."""
    out: dict[str, Any] = {}
    for name, col in columns.items():
        if isinstance(col, pa.DictionaryArray):
            indices = np.repeat(col.indices.to_numpy(), counts)
            out[name] = pa.DictionaryArray.from_arrays(indices, col.dictionary)
        elif isinstance(col, pa.Array):
            out[name] = col.take(pa.array(np.repeat(np.arange(len(col)), counts)))
        else:
            out[name] = np.repeat(col, counts)
    return out


def _strings_onto_rows(
    values: Sequence[str | None], blank: np.ndarray, counts: np.ndarray
) -> pa.DictionaryArray:
    """Per-event strings (None and `blank` events as "") repeated onto rows, as a dictionary.

    Usually every event of a batch has the same value (GPU, no LoRA): one `set` pass then
    replaces converting and hashing each event's string in Arrow.
    """
    distinct = set(values)
    if len(distinct) == 1:
        value = distinct.pop()
        if not value or not blank.any():
            return _constant(value or "", int(counts.sum()))
        blank_rows = np.repeat(blank, counts).astype(np.int32)
        return pa.DictionaryArray.from_arrays(blank_rows, pa.array([value, ""], pa.string()))
    array = pa.array(values, pa.string()).fill_null("")
    if blank.any():
        array = pc.if_else(pa.array(blank), "", array)
    encoded = array.dictionary_encode()
    indices = np.repeat(encoded.indices.to_numpy(), counts)
    return pa.DictionaryArray.from_arrays(indices, encoded.dictionary)


def _ints(values: Sequence[int | None], dtype: pa.DataType, missing: int) -> np.ndarray:
    """Per-event optional ints as numpy (None as `missing`), converted in one call."""
    return pa.array(values, dtype).fill_null(missing).to_numpy(zero_copy_only=False, writable=True)


def _table(columns: dict[str, Any]) -> pa.Table:
    return pa.table(
        {
            name: pa.array(col) if isinstance(col, np.ndarray) else col
            for name, col in columns.items()
        }
    )


def kv_block_events(
    envelopes: Sequence[FlatKVEnvelope],
    offsets: Sequence[int],
    topic: str,
    partition: int,
    parsed: hashes.Hashes | None = None,
) -> pa.Table:
    """`kv_block_events` rows: one per block hash, one per AllBlocksCleared.

    Each event attribute is read with one list comprehension (measured faster than a
    `zip(*map(attrgetter(...)))` transpose) and converted per column in C (pyarrow fills
    the None defaults); per-record and per-event values reach their rows with
    `np.repeat`, since a record's rows are contiguous. `parsed` are the envelopes' block
    hashes when the decode stage has parsed them already.
    """
    events = [event for envelope in envelopes for event in envelope.body.events]
    n_events = len(events)
    events_per_record = np.fromiter(
        (len(e.body.events) for e in envelopes), np.int64, len(envelopes)
    )
    types = [e.type for e in events]
    parents = [e.parent_block_hash for e in events]
    sizes = [e.block_size for e in events]
    tokens = [e.token_count for e in events]
    groups = [e.group_idx for e in events]
    media = [e.medium if e.tier is None else f"{e.medium}/{e.tier}" for e in events]
    media_raw = [e.medium_raw for e in events]
    loras = [e.lora_name for e in events]
    codes = np.fromiter(map(_EVENT_CODES.__getitem__, types), np.int8, n_events)
    stored = codes == 1
    cleared = np.flatnonzero(codes == 3)
    if parsed is None:
        parsed = hashes.parse([e.block_hashes for e in events], MAX_ROWS_PER_RECORD)
    counts, block_hash = _hash_rows(parsed, codes == 3)
    n_rows = len(block_hash)

    event_starts = np.cumsum(counts) - counts
    record_event_starts = np.cumsum(events_per_record) - events_per_record
    event_record = np.repeat(np.arange(len(envelopes)), events_per_record)
    event_index = (np.arange(n_events) - record_event_starts[event_record]).astype(np.uint32)
    row_ends = np.concatenate([[0], np.cumsum(counts)])
    rows_per_record = (
        row_ends[record_event_starts + events_per_record] - row_ends[record_event_starts]
    )
    position = np.arange(n_rows) - np.repeat(event_starts, counts)

    # Stored once per event (its first row): a later row's parent is the previous row's
    # block_hash, derivable, and zeros cost nothing on disk (docs/architecture.md).
    parent_hash = np.zeros(n_rows, np.uint64)
    nonempty = counts > 0
    parent_first = np.where(stored, _ints(parents, pa.uint64(), 0), 0)
    parent_hash[event_starts[nonempty]] = parent_first[nonempty]
    size_row = np.repeat(np.where(stored, np.asarray(sizes, np.int64), 0), counts)
    token_row = np.repeat(np.where(stored, np.asarray(tokens, np.int64), 0), counts)
    per_block = np.clip(token_row - position * size_row, 0, size_row)
    tokens_out = np.where(size_row > 0, per_block, np.where(position == 0, token_row, 0))
    group = _ints(groups, pa.int64(), -1)
    group[cleared] = -1

    is_cleared = codes == 3
    columns = _repeat(_source_columns(envelopes, offsets, topic, partition), rows_per_record)
    columns.update(
        event_index=np.repeat(event_index, counts),
        position=position.astype(np.uint32),
        event=np.repeat(codes, counts),
        block_hash=block_hash,
        parent_hash=parent_hash,
        block_size=_checked(size_row, np.uint32),
        tokens=_checked(tokens_out, np.uint32),
        medium=_strings_onto_rows(media, is_cleared, counts),
        medium_raw=_strings_onto_rows(media_raw, is_cleared, counts),
        lora_name=_strings_onto_rows(loras, ~stored, counts),
        group_idx=_checked(np.repeat(group, counts), np.int32),
    )
    return _table(columns)


def _hash_rows(parsed: hashes.Hashes, cleared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each event and their block hashes: an AllBlocksCleared makes one, hash 0."""
    if parsed.errors:
        raise ValueError(f"block_hashes: {next(iter(parsed.errors.values()))}")
    if not cleared.any():
        return parsed.counts, parsed.values
    counts = np.where(cleared, 1, parsed.counts)
    block_hash = np.zeros(int(counts.sum()), np.uint64)
    block_hash[np.repeat(~cleared, counts)] = parsed.values[np.repeat(~cleared, parsed.counts)]
    return counts, block_hash


def _checked(values: np.ndarray, dtype: type) -> np.ndarray:
    """`values` as `dtype`, raising OverflowError instead of wrapping around."""
    info = np.iinfo(dtype)
    if len(values) and (values.min() < info.min or values.max() > info.max):
        raise OverflowError(f"value out of range for {np.dtype(dtype).name}")
    return values.astype(dtype)


def _flat_column(values: list[Any], kind: str) -> Any:
    if kind == "dict":
        return _dict(values)
    if kind == "string":
        return pa.array(values, pa.string())
    if kind == "ts":
        return seconds_to_ts(values)
    if kind == "map":
        return pa.array([list(v.items()) for v in values], pa.map_(pa.string(), pa.string()))
    if kind.startswith("list_"):
        return pa.array(values, pa.list_(pa.from_numpy_dtype(np.dtype(kind[5:]))))
    if kind == "hashes":
        return pa.array(values, pa.list_(pa.uint64()))
    return np.asarray(values, kind)


def flat_stream(
    stream: str, envelopes: Sequence[Envelope], offsets: Sequence[int], topic: str, partition: int
) -> pa.Table:
    """Rows of a one-row-per-record stream (engine-stats, requests, kv-transfers, ...)."""
    columns = _source_columns(envelopes, offsets, topic, partition)
    bodies = [e.body for e in envelopes]
    for column, attr, kind in FLAT_COLUMNS[stream]:
        columns[column] = _flat_column([getattr(b, attr) for b in bodies], kind)
    return _table(columns)


def stream_rows(
    stream: str,
    envelopes: Sequence[Envelope],
    offsets: Sequence[int],
    topic: str,
    partition: int,
    kv_hashes: hashes.Hashes | None = None,
) -> pa.Table:
    """The raw-table rows of `stream` for these envelopes (`kv_hashes`: see `kv_block_events`)."""
    if stream == "kv-events":  # decode_records gives FlatKVEnvelopes on the KV stream
        flat = cast("Sequence[FlatKVEnvelope]", envelopes)
        return kv_block_events(flat, offsets, topic, partition, kv_hashes)
    return flat_stream(stream, envelopes, offsets, topic, partition)


def rows_and_rejects(
    stream: str, decoded: Decoded, topic: str, partition: int
) -> tuple[pa.Table | None, list[BadRecord]]:
    """The stream's rows for `decoded`, plus records whose values do not fit the columns.

    A value out of a column's range (say dp_rank 70000 for UInt16) must not stall the
    partition: the batch is then rebuilt record by record and the offenders go to
    `ingest_errors`.
    """
    if not decoded.envelopes:
        return None, []
    args = (decoded.envelopes, decoded.offsets)
    try:
        return stream_rows(stream, *args, topic, partition, decoded.kv_hashes), []
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    keep: list[int] = []
    rejects: list[BadRecord] = []
    for i, (envelope, offset) in enumerate(zip(*args, strict=True)):
        try:
            stream_rows(stream, [envelope], [offset], topic, partition)
        except (OverflowError, ValueError, pa.ArrowException) as exc:
            rejects.append(bad_record(decoded.records[i], f"value does not fit its column: {exc}"))
        else:
            keep.append(i)
    if not keep:
        return None, rejects
    envelopes = [decoded.envelopes[i] for i in keep]
    offsets = [decoded.offsets[i] for i in keep]
    return stream_rows(stream, envelopes, offsets, topic, partition), rejects


def stream_gaps(
    stream: str,
    gap_offsets: Sequence[int],
    gap_envelopes: Sequence[Envelope],
    seq_gaps: Sequence[SeqGap],
    topic: str,
    partition: int,
) -> pa.Table:
    """`stream_gaps` rows: publisher `Gap` records, then holes the collector saw."""
    envelopes = [*gap_envelopes, *(g.envelope for g in seq_gaps)]
    offsets = [*gap_offsets, *(g.offset for g in seq_gaps)]
    columns = _source_columns(envelopes, offsets, topic, partition)
    bodies = [cast(Gap, e.body) for e in gap_envelopes]
    n_pub = len(bodies)
    columns.update(
        stream=_constant(stream, len(envelopes)),
        first_seq=np.asarray(
            [b.first_seq for b in bodies] + [g.first_seq for g in seq_gaps], np.uint64
        ),
        last_seq=np.asarray(
            [b.last_seq for b in bodies] + [g.last_seq for g in seq_gaps], np.uint64
        ),
        reason=_dict([b.reason for b in bodies] + ["seq_hole"] * len(seq_gaps)),
        detected_by=_dict(["publisher"] * n_pub + ["collector"] * len(seq_gaps)),
    )
    return _table(columns)


def ingest_errors(bad: Sequence[BadRecord], topic: str, partition: int) -> pa.Table:
    """`ingest_errors` rows: raw bytes (truncated past 1 MiB), position and reason."""
    n = len(bad)
    now_ms = int(time.time() * 1000)
    return pa.table(
        {
            "_topic": _constant(topic, n),
            "_partition": pa.array(np.full(n, partition, np.uint32)),
            "_offset": pa.array(np.asarray([b.offset for b in bad], np.uint64)),
            "key": pa.array([b.key[:MAX_ERROR_VALUE] for b in bad], pa.binary()),
            "value": pa.array([b.value[:MAX_ERROR_VALUE] for b in bad], pa.binary()),
            "value_size": pa.array(np.asarray([len(b.value) for b in bad], np.uint64)),
            "reason": pa.array([b.reason for b in bad], pa.string()),
            "ingested_at": pa.array(np.full(n, now_ms, np.int64), pa.timestamp("ms", tz="UTC")),
        }
    )

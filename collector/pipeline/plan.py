"""Insert planning for exactly-once: which rows go in which insert, and their tokens.

Pure: no client, no I/O; the sink (`kvscope.collector.pipeline.write`) runs the plan.

Exactly once rests on one invariant: for every Kafka partition, the records whose rows
are stored form a prefix of the partition (up to the largest stored `_offset`), except
inside the one batch noted in `ingest_batches`. On assignment the collector resumes right
after the prefix, or re-reads the noted batch skipping what of it is stored.

An insert is atomic only within one table partition (PARTITION BY value), so
`plan_inserts` makes one insert per (table, partition value) of a flush, shared by every
Kafka partition in it. When that order is not each partition's offset order (records
alternate between days or tables), the batch's offset range is noted first, in one
insert into the unpartitioned `ingest_batches`. Rows the collector derives itself (gap
rows) go first, in one insert into an unpartitioned table.

Each insert carries an `insert_deduplication_token` computed from its content's Kafka
positions, so retrying a failed insert never doubles rows, in the raw table or in the
materialized views (`deduplicate_blocks_in_dependent_materialized_views`). A flush with
inserts that feed views is journaled around them (`journaled`), so that one cut between
its raw part and its view part by a crash is repeated on assignment
(`kvscope.collector.pipeline.journal`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kvscope.collector.pipeline import journal
from kvscope.collector.storage.tables import (
    INGEST_BATCHES,
    INGEST_INSERTS,
    PARTITIONED_BY_DAY,
    STREAM_GAPS,
    VIEW_SOURCES,
)
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD

DAY_US = 86_400 * 1_000_000
"""Tables partitioned by `toDate(ts)` (UTC); the others are unpartitioned."""
MAX_INSERT_ROWS = 2_000_000
"""Rows one insert may hold and still be squashed into one block (the plan stays below)."""
MAX_FLUSH_ROWS = MAX_INSERT_ROWS - MAX_ROWS_PER_RECORD
"""Rows buffered before the collector stops taking records: one more record still fits."""


@dataclasses.dataclass
class PartitionBatch:
    """The buffered rows of one Kafka partition, per destination table, in offset order."""

    topic: str
    partition: int
    tables: dict[str, pa.Table]
    """Primary rows: each record's rows live in exactly one of these tables."""
    derived_gaps: pa.Table | None
    """Gap rows the collector derived (stored first; see `kvscope.collector.pipeline.gaps`)."""
    next_offset: int
    """Offset to commit once every row is stored (last buffered record + 1)."""
    first_offset: int = 0
    """Offset of the first buffered record."""


@dataclasses.dataclass(frozen=True)
class Insert:
    """One atomic insert: rows of one table (and one partition value) plus its token."""

    table: str
    rows: pa.Table
    token: str
    positions: tuple[tuple[str, int, int, int, int], ...] = ()
    """(topic, partition, first offset, last offset, rows) per Kafka partition in it."""


def _token(
    table: str,
    key: int,
    parts: Sequence[tuple[str, int, int, int, int]],
    rows: pa.Table | None = None,
) -> str:
    """The insert's deduplication token: its Kafka positions and, given `rows`, a digest
    of their content (a broker that lost its log repeats positions with other records,
    which must not be dropped as duplicates)."""
    text = f"{table}|{key}|" + ";".join(f"{t}:{p}:{a}-{b}:{n}" for t, p, a, b, n in parts)
    digest = hashlib.sha256(text.encode())
    for name in ("epoch", "seq", "value_size"):
        if rows is not None and name in rows.column_names:
            for chunk in rows.column(name).chunks:  # the column's bytes, not copied
                digest.update(chunk.to_numpy(zero_copy_only=False))
    return digest.hexdigest()[:40]


def _row_keys(name: str, rows: pa.Table) -> np.ndarray:
    """Per row: the table partition it lands in (UTC day, or 0 for unpartitioned tables)."""
    if name in PARTITIONED_BY_DAY and rows.num_rows:
        ts = rows.column("ts").cast(pa.int64())
        bounds = pc.min_max(ts)
        first, last = bounds["min"].as_py() // DAY_US, bounds["max"].as_py() // DAY_US
        if first != last:  # rows of more than one day (else one value, no per-row division)
            return ts.to_numpy() // DAY_US
        return np.full(rows.num_rows, first, np.int64)
    return np.zeros(rows.num_rows, np.int64)


def _rows_in(name: str, rows: pa.Table, key: int) -> pa.Table:
    """The rows of `rows` that land in table partition `key`; `rows` itself (no copy)
    when all of them do, as a flush within one day does."""
    keys = _row_keys(name, rows)
    inside = keys == key
    if inside.all():
        return rows
    return rows.filter(pa.array(inside))


def _record_runs(batch: PartitionBatch) -> list[tuple[str, int]]:
    """The (table, partition value) of each maximal run of records, in offset order."""
    offsets, groups = [], []
    names = sorted(batch.tables)
    for table_id, name in enumerate(names):
        rows = batch.tables[name]
        if rows.num_rows == 0:
            continue
        offs = rows.column("_offset").to_numpy()
        first = np.ones(len(offs), bool)
        first[1:] = offs[1:] != offs[:-1]
        offsets.append(offs[first])
        keys = _row_keys(name, rows)[first]
        groups.append(np.stack([np.full(len(keys), table_id), keys], axis=1))
    if not offsets:
        return []
    order = np.argsort(np.concatenate(offsets), kind="stable")
    per_record = np.concatenate(groups)[order]
    change = np.ones(len(per_record), bool)
    change[1:] = (per_record[1:] != per_record[:-1]).any(axis=1)
    return [(names[int(t)], int(k)) for t, k in per_record[change]]


def _positions(rows: pa.Table) -> tuple[str, int, int, int, int]:
    """(topic, partition, first offset, last offset, rows) of one partition's rows."""
    offsets = rows.column("_offset").to_numpy()
    return (
        str(rows.column("_topic")[0].as_py()),
        int(rows.column("_partition")[0].as_py()),
        int(offsets.min()),
        int(offsets.max()),
        rows.num_rows,
    )


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    """One table whose chunks share one dictionary per column (Arrow IPC needs that)."""
    return pa.concat_tables(tables).unify_dictionaries()


def _batch_notes(batches: Sequence[PartitionBatch]) -> Insert:
    """The `ingest_batches` rows of batches about to be stored out of offset order."""
    parts = [(b.topic, b.partition, b.first_offset, b.next_offset - 1, 1) for b in batches]
    rows = pa.table(
        {
            "_topic": pa.array([b.topic for b in batches], pa.string()).dictionary_encode(),
            "_partition": pa.array([b.partition for b in batches], pa.uint32()),
            "first_offset": pa.array([b.first_offset for b in batches], pa.uint64()),
            "next_offset": pa.array([b.next_offset for b in batches], pa.uint64()),
            "written_at": pa.array(
                [int(time.time() * 1000)] * len(batches), pa.timestamp("ms", tz="UTC")
            ),
        }
    )
    return Insert(INGEST_BATCHES.name, rows, _token("batches", 0, parts))


def plan_inserts(batches: Sequence[PartitionBatch]) -> list[Insert]:
    """The inserts that store `batches`: one per (table, partition value), all partitions.

    Order: derived gap rows, then the note of every batch whose records would not be
    stored as a prefix (its runs of records visit a (table, day) twice, or in another
    order than the shared insert order), then one insert per (table, day) in order of
    first appearance. A batch stored in offset order needs no note.
    """
    plan: list[Insert] = []
    gaps = [b.derived_gaps for b in batches if b.derived_gaps is not None]
    gaps = [t for t in gaps if t.num_rows]
    if gaps:
        parts = [_positions(t) for t in gaps]
        rows = _concat(gaps)
        plan.append(Insert(STREAM_GAPS.name, rows, _token("gaps", 0, parts, rows)))
    order: dict[tuple[str, int], int] = {}
    noted: list[PartitionBatch] = []
    for batch in batches:
        runs = _record_runs(batch)
        for group in runs:
            order.setdefault(group, len(order))
        ranks = [order[group] for group in runs]
        if any(b <= a for a, b in itertools.pairwise(ranks)):
            noted.append(batch)
    if noted:
        plan.append(_batch_notes(noted))
    for table, key in order:
        slices = []
        for batch in batches:
            rows = batch.tables.get(table)
            if rows is None or rows.num_rows == 0:
                continue
            part = _rows_in(table, rows, key)
            if part.num_rows:
                slices.append(part)
        parts = [_positions(s) for s in slices]
        rows = _concat(slices)
        plan.append(Insert(table, rows, _token(table, key, parts, rows), tuple(parts)))
    return plan


def journaled(
    plan: list[Insert], flush: int, done: Sequence[journal.Mark] = ()
) -> tuple[list[Insert], list[journal.Mark]]:
    """`plan` after one journal insert, and the done marks it leaves to write once stored.

    The journal insert holds the flush's view-feeding inserts per Kafka partition (even
    version `2 * flush`) and the `done` marks of earlier flushes, except for partitions
    this flush journals anew. Without either, `plan` is returned as it is.
    """
    entries = [
        journal.describe(i.table, i.rows, i.token, _day(i), i.positions)
        for i in plan
        if i.table in VIEW_SOURCES
    ]
    partitions = journal.partitions_of(entries)
    version = 2 * flush
    marks = [(t, p, version) for t, p in partitions]
    texts = [journal.encode(entries)] * len(marks)
    fresh = set(partitions)
    finished = [m for m in done if (m[0], m[1]) not in fresh]
    if not marks and not finished:
        return plan, []
    rows = journal.journal_rows(marks + finished, texts + [""] * len(finished))
    token = _token("journal", version, [(t, p, v, v, 0) for t, p, v in marks + finished])
    return [Insert(INGEST_INSERTS.name, rows, token), *plan], [
        (t, p, version + 1) for t, p, _ in marks
    ]


def _day(insert: Insert) -> int | None:
    if insert.table not in PARTITIONED_BY_DAY:
        return None
    return int(_row_keys(insert.table, insert.rows.slice(0, 1))[0])

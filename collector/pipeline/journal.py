"""The journal of inserts that feed materialized views: its rows, and how to find them again.

An insert into a raw table that feeds a view (`VIEW_SOURCES`) lands in two parts,
committed one after the other: the raw table's, then the view's. A collector killed in
between leaves raw rows whose aggregate never lands, and the next owner resumes after
those rows, so the aggregate would stay short for good. The writer therefore journals
each such flush in `ingest_inserts` (migration 006), per Kafka partition: its entries with an even
version, in one insert before its first insert; the next, odd version (done) goes into
the next flush's journal insert (or, when none comes, into one of its own once the
collector is quiet). On assignment a partition whose latest version is even has its flush
repeated from the stored raw rows with the same deduplication tokens: the raw table drops
them, each view inserts what it misses and drops what it has
(`deduplicate_blocks_in_dependent_materialized_views`). Done flushes are never repeated,
so a token is only reused while it is recent (well inside the deduplication window).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pyarrow as pa
from kvscope.collector.storage.tables import VIEW_SOURCES


class JournaledInsert(msgspec.Struct, array_like=True, frozen=True):
    """One insert into a view-feeding table: enough to select its rows and repeat it."""

    table: str
    token: str
    day: int | None
    """UTC day number of the rows (tables partitioned by day), else None."""
    rows: int
    ranges: tuple[tuple[str, int, int, int], ...]
    """Per Kafka partition in the insert: (topic, partition, first offset, last offset)."""
    chunks: tuple[int, ...]
    """Rows per Arrow record batch of the insert: ClickHouse derives the deduplication id
    from the token and the source's chunks, so the repeat is cut the same way."""


_entries = msgspec.json.Decoder(list[JournaledInsert])


def describe(
    table: str,
    rows: pa.Table,
    token: str,
    day: int | None,
    positions: Sequence[tuple[str, int, int, int, int]],
) -> JournaledInsert:
    """The journal entry of one planned insert of `rows` into `table`; `positions` are its
    (topic, partition, first offset, last offset, rows) per Kafka partition."""
    ranges = tuple(sorted((t, p, first, last) for t, p, first, last, _ in positions))
    chunks = tuple(batch.num_rows for batch in rows.to_batches())
    return JournaledInsert(table, token, day, rows.num_rows, ranges, chunks)


def rechunked(entry: JournaledInsert, rows: pa.Table) -> pa.Table:
    """`rows` (the insert's rows read back) cut into the record batches of `entry`."""
    whole = rows.combine_chunks()
    batches, start = [], 0
    for size in entry.chunks:
        batches += whole.slice(start, size).to_batches()
        start += size
    return pa.Table.from_batches(batches, schema=whole.schema)


def encode(entries: Sequence[JournaledInsert]) -> str:
    """The `inserts` column of a flush's journal rows."""
    return msgspec.json.encode(list(entries)).decode()


def decode(text: str) -> list[JournaledInsert]:
    """The entries of a journal row (empty for a done row)."""
    return _entries.decode(text) if text else []


Mark = tuple[str, int, int]
"""(topic, partition, version): one `ingest_inserts` row."""


def journal_rows(marks: Sequence[Mark], texts: Sequence[str]) -> pa.Table:
    """`ingest_inserts` rows: per mark its topic, partition and version, with its text."""
    return pa.table(
        {
            "_topic": pa.array([t for t, _, _ in marks], pa.string()).dictionary_encode(),
            "_partition": pa.array([p for _, p, _ in marks], pa.uint32()),
            "version": pa.array([v for _, _, v in marks], pa.uint64()),
            "inserts": pa.array(list(texts), pa.string()),
            "written_at": pa.array(
                [int(time.time() * 1000)] * len(marks), pa.timestamp("ms", tz="UTC")
            ),
        }
    )


def partitions_of(entries: Sequence[JournaledInsert]) -> list[tuple[str, int]]:
    """Every (topic, partition) the entries hold rows of, sorted."""
    return sorted({(topic, partition) for e in entries for topic, partition, _, _ in e.ranges})


def rows_condition(entry: JournaledInsert) -> tuple[str, dict[str, Any]]:
    """`WHERE` text and parameters selecting exactly the stored rows of `entry`'s insert.

    Raises ValueError when the entry names a table that feeds no view (the journal is
    database content: its table name is checked before it is spliced into SQL).
    """
    if entry.table not in VIEW_SOURCES:
        raise ValueError(f"journal entry names table {entry.table!r}, which feeds no view")
    clauses, params = [], {}
    for i, (topic, partition, first, last) in enumerate(entry.ranges):
        params.update({f"t{i}": topic, f"p{i}": partition, f"a{i}": first, f"b{i}": last})
        clauses.append(
            f"(_topic = {{t{i}:String}} AND _partition = {{p{i}:UInt32}} "
            f"AND _offset BETWEEN {{a{i}:UInt64}} AND {{b{i}:UInt64}})"
        )
    where = "(" + " OR ".join(clauses) + ")"
    if entry.day is not None:
        params["day"] = entry.day
        where += " AND intDiv(toUnixTimestamp64Micro(ts), 86400000000) = {day:Int64}"
    return where, params


def done_version(version: int) -> int:
    """The odd version that marks the flush of `version` done."""
    return version | 1


def unfinished(rows: Sequence[tuple[Any, ...]]) -> dict[int, list[JournaledInsert]]:
    """Per partition whose latest (version, inserts) row is not done: its entries."""
    return {int(p): decode(str(text)) for p, version, text in rows if int(version) % 2 == 0}

"""Write stage: plan inserts that keep exactly-once, and the ClickHouse sink that runs them.

Exactly once rests on one invariant: for every Kafka partition, the records whose rows
are stored always form a prefix of the partition (up to the largest stored `_offset`).
On assignment the collector resumes right after that prefix. An insert is atomic only
within one table partition (PARTITION BY value), so `plan_inserts` cuts each Kafka
partition's records into runs of one (table, partition value) and inserts the runs in
offset order; runs of different Kafka partitions that hit the same (table, partition
value) in the same round share one insert. Rows the collector derives itself (gap rows)
go first, in one insert into an unpartitioned table.

Each insert carries an `insert_deduplication_token` computed from its content's Kafka
positions, so retrying a failed insert never doubles rows, in the raw table or in the
materialized views (`deduplicate_blocks_in_dependent_materialized_views`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import metrics
from kvscope.collector.storage.cluster import local_name
from kvscope.collector.storage.tables import INGEST_ERRORS, PARTITIONED_BY_DAY, STREAM_GAPS
from kvscope.collector.storage.target import Target, connect

log = logging.getLogger(__name__)

DAY_US = 86_400 * 1_000_000
"""Tables partitioned by `toDate(ts)` (UTC); the others are unpartitioned."""
MAX_INSERT_ROWS = 2_000_000
"""Rows one insert may hold and still be squashed into one block (the plan stays below)."""
INSERT_SETTINGS = {
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    "max_insert_block_size": MAX_INSERT_ROWS,
    "min_insert_block_size_rows": MAX_INSERT_ROWS,
    "min_insert_block_size_bytes": 0,
}
"""Settings of every insert: MVs dedupe too, and one insert stays one block (one part).

`INSERT ... SELECT FROM Python(table)` reads the Arrow table in blocks of ~32k rows;
squashing them up to `MAX_INSERT_ROWS` rows (no byte bound) makes the whole insert one
block: one part, one deduplication token, atomic. Without squashing every 32k rows became
a part of their own, and merging them back cost more than the insert itself.
"""
CLUSTER_INSERT_SETTINGS = {"insert_quorum": "auto", "insert_quorum_parallel": 0}
"""Cluster mode: an insert is acknowledged once a majority of the shard's replicas have it,
in order, so a resume read with sequential consistency cannot miss it (a retry with the
same token is still dropped by the replicated deduplication window)."""
CLUSTER_READ_SETTINGS = {"select_sequential_consistency": 1}
"""Cluster mode: resume positions are read (through the Distributed tables, from every
shard) only from replicas that have every quorum insert; a lagging one fails the read,
which the collector retries, instead of returning an older position."""


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


@dataclasses.dataclass(frozen=True)
class Insert:
    """One atomic insert: rows of one table (and one partition value) plus its token."""

    table: str
    rows: pa.Table
    token: str


def _token(table: str, key: int, parts: Sequence[tuple[str, int, int, int, int]]) -> str:
    text = f"{table}|{key}|" + ";".join(f"{t}:{p}:{a}-{b}:{n}" for t, p, a, b, n in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _record_runs(batch: PartitionBatch) -> list[tuple[str, int, int, int]]:
    """Maximal runs (table, partition value, first offset, last offset) in offset order."""
    offsets, table_ids, keys = [], [], []
    names = sorted(batch.tables)
    for table_id, name in enumerate(names):
        rows = batch.tables[name]
        if rows.num_rows == 0:
            continue
        offs = rows.column("_offset").to_numpy()
        first = np.ones(len(offs), bool)
        first[1:] = offs[1:] != offs[:-1]
        offsets.append(offs[first])
        table_ids.append(np.full(int(first.sum()), table_id))
        if name in PARTITIONED_BY_DAY:
            ts = rows.column("ts").combine_chunks().cast(pa.int64()).to_numpy()
            keys.append(ts[first] // DAY_US)
        else:
            keys.append(np.zeros(int(first.sum()), np.int64))
    if not offsets:
        return []
    all_offsets = np.concatenate(offsets)
    order = np.argsort(all_offsets, kind="stable")
    all_offsets = all_offsets[order]
    all_tables = np.concatenate(table_ids)[order]
    all_keys = np.concatenate(keys)[order]
    change = np.flatnonzero((all_tables[1:] != all_tables[:-1]) | (all_keys[1:] != all_keys[:-1]))
    starts = np.concatenate([[0], change + 1])
    ends = np.concatenate([change, [len(all_offsets) - 1]])
    return [
        (names[all_tables[s]], int(all_keys[s]), int(all_offsets[s]), int(all_offsets[e]))
        for s, e in zip(starts, ends, strict=True)
    ]


def _positions(rows: pa.Table) -> tuple[str, int, int, int, int]:
    """(topic, partition, first offset, last offset, rows) of one partition's rows."""
    offsets = rows.column("_offset").to_numpy()
    return (
        str(rows.column("_topic")[0].as_py()),
        int(rows.column("_partition")[0].as_py()),
        int(offsets[0]),
        int(offsets[-1]),
        rows.num_rows,
    )


def _slice(rows: pa.Table, first: int, last: int) -> pa.Table:
    offs = rows.column("_offset").to_numpy()
    lo = int(np.searchsorted(offs, first, "left"))
    hi = int(np.searchsorted(offs, last, "right"))
    return rows.slice(lo, hi - lo)


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    """One table whose chunks share one dictionary per column (Arrow IPC needs that)."""
    return pa.concat_tables(tables).unify_dictionaries()


def plan_inserts(batches: Sequence[PartitionBatch]) -> list[Insert]:
    """The inserts that store `batches` while keeping every partition's stored prefix."""
    plan: list[Insert] = []
    gaps = [b.derived_gaps for b in batches if b.derived_gaps is not None]
    gaps = [t for t in gaps if t.num_rows]
    if gaps:
        parts = [_positions(t) for t in gaps]
        plan.append(Insert(STREAM_GAPS.name, _concat(gaps), _token("gaps", 0, parts)))
    heads = [(b, _record_runs(b)) for b in batches]
    while any(runs for _, runs in heads):
        groups: dict[tuple[str, int], list[tuple[PartitionBatch, int, int]]] = {}
        for batch, runs in heads:
            if runs:
                table, key, first, last = runs.pop(0)
                groups.setdefault((table, key), []).append((batch, first, last))
        for (table, key), members in sorted(groups.items()):
            slices = [_slice(b.tables[table], first, last) for b, first, last in members]
            parts = [
                (b.topic, b.partition, first, last, s.num_rows)
                for (b, first, last), s in zip(members, slices, strict=True)
            ]
            plan.append(Insert(table, _concat(slices), _token(table, key, parts)))
    return plan


class Sink(Protocol):
    """The write boundary: stores one insert, or raises `SinkError` (retriable)."""

    def insert(self, insert: Insert) -> None:
        """Store `insert` atomically; the same token twice stores it once."""

    def resume_state(
        self, topic: str, table: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, list[tuple[str, int, int, int]]]]:
        """Per partition: the next offset after the stored prefix, and stored max seqs."""


class ClickHouseSink:
    """The real sink: one clickhouse-connect client, serialized by a lock.

    Thread-safe and shareable: several collectors in one process (chDB allows one data
    directory per process) can use one sink.
    """

    def __init__(
        self, client: Any, in_place: bool | None = None, cluster: str | None = None
    ) -> None:
        self.client = client
        self.in_place = type(client).__name__ == "ChdbClient" if in_place is None else in_place
        """Insert with chDB's `Python(table)` (default for chDB in this process: no IPC
        file); otherwise clickhouse-connect's `insert_arrow`, the only way for a server."""
        self.cluster = cluster
        """Cluster mode (`CollectorConfig.cluster`): inserts go to the shard-local tables
        with CLUSTER_INSERT_SETTINGS, resume reads use CLUSTER_READ_SETTINGS."""
        self._lock = threading.Lock()

    @classmethod
    def open(cls, target: Target, cluster: str | None = None) -> ClickHouseSink:
        """Connect to `target` (its tables must exist: run migrations first)."""
        try:
            return cls(connect(target), cluster=cluster)
        except Exception as exc:
            raise SinkError(f"cannot connect to {target.safe_url}: {exc}") from exc

    def insert(self, insert: Insert) -> None:
        """Insert one planned block with its deduplication token."""
        settings = {**INSERT_SETTINGS, "insert_deduplication_token": insert.token}
        table = insert.table
        if self.cluster is not None:
            settings.update(CLUSTER_INSERT_SETTINGS)
            table = local_name(table)
        started = time.perf_counter()
        try:
            with self._lock:
                if self.in_place:
                    self._insert_in_place(table, insert.rows, settings)
                else:
                    self.client.insert_arrow(table, insert.rows, settings=settings)
        except Exception as exc:
            raise SinkError(f"insert into {insert.table} failed: {exc}") from exc
        metrics.INSERT_SECONDS.labels(insert.table).observe(time.perf_counter() - started)
        metrics.ROWS_INSERTED.labels(insert.table).inc(insert.rows.num_rows)

    def _insert_in_place(self, table: str, rows: pa.Table, settings: dict[str, Any]) -> None:
        """`INSERT ... SELECT FROM Python(rows)`: chDB reads the local Arrow table `rows`.

        Table and column names come from our own schema; setting values are ints and
        a hex token, so inlining them is safe.
        """
        names = ", ".join(f"`{name}`" for name in rows.column_names)
        values = ", ".join(f"{key} = '{value}'" for key, value in settings.items())
        self.client.command(
            f"INSERT INTO {table} ({names}) SELECT {names} FROM Python(rows) SETTINGS {values}"
        )

    def _rows(self, sql: str, parameters: dict[str, Any]) -> list[tuple[Any, ...]]:
        settings = CLUSTER_READ_SETTINGS if self.cluster is not None else None
        try:
            with self._lock:
                answer = self.client.query(sql, parameters=parameters, settings=settings)
                return list(answer.result_rows)
        except Exception as exc:
            raise SinkError(f"query failed: {exc}") from exc

    def resume_state(
        self, topic: str, table: str, partitions: Sequence[int]
    ) -> tuple[dict[int, int], dict[int, list[tuple[str, int, int, int]]]]:
        """Next offset after the stored prefix, and max stored seq per source and epoch."""
        params = {"topic": topic, "partitions": list(partitions)}
        where = "_topic = {topic:String} AND _partition IN {partitions:Array(UInt32)}"
        data = self._rows(
            f"SELECT _partition, instance, dp_rank, epoch, max(_offset) + 1, max(seq) "
            f"FROM {table} WHERE {where} GROUP BY _partition, instance, dp_rank, epoch",
            params,
        )
        gaps = self._rows(
            f"SELECT _partition, instance, dp_rank, epoch, "
            f"maxIf(_offset + 1, detected_by = 'publisher'), max(seq) "
            f"FROM {STREAM_GAPS.name} WHERE {where} GROUP BY _partition, instance, dp_rank, epoch",
            params,
        )
        errors = self._rows(
            f"SELECT _partition, 0, 0, 0, max(_offset) + 1, 0 FROM {INGEST_ERRORS.name} "
            f"WHERE {where} GROUP BY _partition",
            params,
        )
        next_offsets: dict[int, int] = {}
        seqs: dict[int, dict[tuple[str, int, int], int]] = {}
        for partition, instance, dp_rank, epoch, next_offset, seq in data + gaps:
            next_offsets[partition] = max(next_offsets.get(partition, 0), int(next_offset))
            per_source = seqs.setdefault(partition, {})
            key = (str(instance), int(dp_rank), int(epoch))
            per_source[key] = max(per_source.get(key, -1), int(seq))
        for partition, *_, next_offset, _ in errors:
            next_offsets[partition] = max(next_offsets.get(partition, 0), int(next_offset))
        return next_offsets, {
            p: [(*key, seq) for key, seq in per.items()] for p, per in seqs.items()
        }

    def close(self) -> None:
        """Close the client."""
        with self._lock:
            self.client.close()

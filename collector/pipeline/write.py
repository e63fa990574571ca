"""Write stage: the ClickHouse sink that runs the planned inserts, and resume reads.

The plan (which rows go in which insert, their deduplication tokens, the journal) is
`kvscope.collector.pipeline.plan`; this module does the I/O: inserts with the settings
that keep one insert one block and deduplicated, the reads that tell a new owner where
each partition's stored records end, and the repeat of journaled inserts a crash cut.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import journal, metrics
from kvscope.collector.pipeline.plan import MAX_INSERT_ROWS, Insert, journaled
from kvscope.collector.storage import residency
from kvscope.collector.storage.client import Client
from kvscope.collector.storage.store import Store, open_store
from kvscope.collector.storage.tables import (
    INGEST_BATCHES,
    INGEST_ERRORS,
    INGEST_INSERTS,
    STREAM_GAPS,
)
from kvscope.collector.storage.target import Target
from kvscope.schemas.codec import MALFORMED
from kvscope.schemas.errors import KvscopeError

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class Replay:
    """A noted batch whose records may be stored only in part: re-read it, skip `stored`."""

    first_offset: int
    next_offset: int
    stored: frozenset[int]
    """Offsets of the batch that already have their rows."""


@dataclasses.dataclass(frozen=True)
class LastStored:
    """The last stored record of a partition, to recognise it when it is read again.

    A broker that lost its log (or a recreated topic) restarts offsets at 0: the offset
    after the stored prefix then names some other record, or none yet. The collector
    re-reads the last stored offset on assignment and compares.
    """

    offset: int
    source: tuple[str, int, int] | None
    """(instance, dp_rank, epoch) of a stream or Gap record; None for an ingest_errors one."""
    max_seq: int = 0
    """The largest seq stored for that source: the record's seq is at most this."""
    value_size: int = 0
    """Size of an ingest_errors record's value."""
    prefix: bytes = b""
    """First bytes of an ingest_errors record's value."""

    def matches(self, value: bytes | None) -> bool:
        """True when the record value read at `offset` can be the one stored."""
        data = value or b""
        if self.source is None:
            return len(data) == self.value_size and data.startswith(self.prefix)
        who = record_identity(data)
        return who is not None and who[0] == self.source and who[1] <= self.max_seq


class _Source(msgspec.Struct):
    instance: str
    dp_rank: int = 0


class _Identity(msgspec.Struct):
    """Just what tells one stored record from another: whose it is and its seq."""

    source: _Source
    epoch: int
    seq: int


_identity = msgspec.msgpack.Decoder(_Identity)


def record_identity(value: bytes | None) -> tuple[tuple[str, int, int], int] | None:
    """(instance, dp_rank, epoch) and seq of a kvscope record; None when it has none."""
    try:
        who = _identity.decode(value or b"")
    except (msgspec.ValidationError, *MALFORMED):
        return None
    return (who.source.instance, who.source.dp_rank, who.epoch), who.seq


@dataclasses.dataclass
class ResumeState:
    """What the stored tables say about the partitions of one topic (see `Sink`)."""

    next_offsets: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per partition: the offset after the stored prefix."""
    seqs: dict[int, list[tuple[str, int, int, int]]] = dataclasses.field(default_factory=dict)
    """Per partition: (instance, dp_rank, epoch, max stored seq), oldest first."""
    replays: dict[int, Replay] = dataclasses.field(default_factory=dict)
    """Partitions whose noted batch ended inside the stored prefix's last batch (each
    also has its `last`: the batch is re-read only once that record is found again)."""
    last: dict[int, LastStored] = dataclasses.field(default_factory=dict)
    """Per partition with stored records: its last stored record."""
    journal: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per partition: the latest `ingest_inserts` version (new flushes must exceed it)."""


class Sink(Protocol):
    """The write boundary: stores one insert, or raises `SinkError` (retriable)."""

    def insert(self, insert: Insert) -> None:
        """Store `insert` atomically; the same token twice stores it once."""

    def resume_state(self, topic: str, table: str, partitions: Sequence[int]) -> ResumeState:
        """Per partition: where stored records end, stored max seqs, a batch to re-read."""


class ClickHouseSink:
    """The real sink: one store (its clickhouse-connect client), serialized by a lock.

    Thread-safe and shareable: several collectors in one process (chDB allows one data
    directory per process) can use one sink.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        """The backend: chDB (inserts in place), a server, or a cluster (`storage.store`)."""
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        """The store's clickhouse-connect client."""
        return self.store.client

    @classmethod
    def open(cls, target: Target, cluster: str | None = None) -> ClickHouseSink:
        """Connect to `target` (its tables must exist: run migrations first)."""
        try:
            return cls(open_store(target, cluster))
        except KvscopeError:  # already one line naming the target
            raise
        except Exception as exc:
            raise SinkError(f"cannot connect to {target.safe_url}: {exc}") from exc

    def insert(self, insert: Insert) -> None:
        """Insert one planned block with its deduplication token."""
        started = time.perf_counter()
        self._store(insert)
        metrics.INSERT_SECONDS.labels(insert.table).observe(time.perf_counter() - started)
        metrics.ROWS_INSERTED.labels(insert.table).inc(insert.rows.num_rows)

    def _store(self, insert: Insert) -> None:
        """Send `insert` to ClickHouse (SinkError when it fails)."""
        settings = {**INSERT_SETTINGS, "insert_deduplication_token": insert.token}
        try:
            with self._lock:
                self.store.insert(self.store.insert_table(insert.table), insert.rows, settings)
        except Exception as exc:
            raise SinkError(f"insert into {insert.table} failed: {exc}") from exc

    def refresh_residency(self) -> None:
        """Derive the residency of the block events stored so far (`storage.residency`)."""
        try:
            with self._lock:
                residency.refresh(self.client)
        except Exception as exc:
            raise SinkError(f"residency refresh failed: {exc}") from exc

    def _rows(self, sql: str, parameters: dict[str, Any]) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                answer = self.client.query(
                    sql, parameters=parameters, settings=self.store.read_settings()
                )
                return list(answer.result_rows)
        except Exception as exc:
            raise SinkError(f"query failed: {exc}") from exc

    def resume_state(self, topic: str, table: str, partitions: Sequence[int]) -> ResumeState:
        """Where each partition's stored records end, its max seqs, and a batch to re-read.

        First repeats the partitions' unfinished journaled flushes (`repair_views`).
        """
        versions = self.repair_views(topic, partitions) if self.store.journaled else {}
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
        state = ResumeState(journal=versions)
        seqs: dict[int, dict[tuple[str, int, int], int]] = {}
        last_source: dict[int, tuple[str, int, int]] = {}
        # oldest first: the gap tracker keeps the most recent sources when it must prune
        for partition, instance, dp_rank, epoch, next_offset, seq in sorted(
            data + gaps, key=lambda row: int(row[4] or 0)
        ):
            key = (str(instance), int(dp_rank), int(epoch))
            if int(next_offset) > state.next_offsets.get(partition, 0):
                state.next_offsets[partition] = int(next_offset)
                last_source[partition] = key
            per_source = seqs.setdefault(partition, {})
            per_source[key] = max(per_source.get(key, -1), int(seq))
        for partition, *_, next_offset, _ in errors:
            if int(next_offset) > state.next_offsets.get(partition, 0):
                state.next_offsets[partition] = int(next_offset)
                last_source.pop(partition, None)
        state.seqs = {p: [(*key, seq) for key, seq in per.items()] for p, per in seqs.items()}
        for partition, next_offset in state.next_offsets.items():
            last_key = last_source.get(partition)
            if last_key is not None:
                state.last[partition] = LastStored(
                    next_offset - 1, last_key, seqs[partition][last_key]
                )
            else:
                state.last[partition] = self._last_error(topic, partition, next_offset - 1)
        notes = self._rows(
            f"SELECT _partition, argMax(first_offset, next_offset), max(next_offset) "
            f"FROM {INGEST_BATCHES.name} WHERE {where} GROUP BY _partition",
            params,
        )
        for partition, first, end in notes:
            if int(first) < state.next_offsets.get(partition, 0) <= int(end):
                state.replays[partition] = Replay(
                    int(first), int(end), self._stored_offsets(topic, table, partition, first, end)
                )
        return state

    def repair_views(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """Repeat the unfinished journaled flush of each of `partitions`, then mark it done.

        Returns every partition's latest journal version. An insert whose raw rows are
        not stored is skipped (its records are read again from Kafka); one whose stored
        rows do not match its journal entry (a broker that lost its log reused the
        offsets) is skipped with a warning.
        """
        rows = self._rows(
            f"SELECT _partition, max(version), argMax(inserts, version) "
            f"FROM {INGEST_INSERTS.name} WHERE _topic = {{topic:String}} "
            "AND _partition IN {partitions:Array(UInt32)} GROUP BY _partition",
            {"topic": topic, "partitions": list(partitions)},
        )
        versions = {int(p): int(v) for p, v, _ in rows}
        unfinished = journal.unfinished(rows)
        repeated: set[str] = set()
        for entries in unfinished.values():
            for entry in entries:
                if entry.token not in repeated:
                    repeated.add(entry.token)
                    self._repeat(entry)
        if unfinished:
            done = [(topic, p, journal.done_version(versions[p])) for p in sorted(unfinished)]
            [marks], _ = journaled([], 0, done)
            self.insert(marks)
            versions.update({p: v for _, p, v in done})
        return versions

    def _repeat(self, entry: journal.JournaledInsert) -> None:
        """Insert the stored rows of `entry` again with its token (see `journal`)."""
        try:
            where, params = journal.rows_condition(entry)
        except ValueError as exc:
            log.warning("%s: %s; not repeated", INGEST_INSERTS.name, exc)
            return
        try:
            with self._lock:
                rows = self.client.query_arrow(
                    f"SELECT * FROM {entry.table} WHERE {where}", parameters=params
                )
        except Exception as exc:
            raise SinkError(f"reading an insert of {entry.table} back failed: {exc}") from exc
        if rows.num_rows == 0:
            return
        if rows.num_rows != entry.rows:
            log.warning(
                "%s: insert %s has %d stored rows, its journal entry %d; not repeated",
                entry.table, entry.token, rows.num_rows, entry.rows,
            )  # fmt: skip
            return
        # Through the same path and cut into the same chunks as the original insert: the
        # deduplication id is the token extended by the source's chunks (an INSERT ...
        # SELECT from the table itself would extend it by the parts it reads: no match).
        # Not counted as inserted rows: the raw table drops them, the views at most catch up.
        self._store(Insert(entry.table, journal.rechunked(entry, rows), entry.token))
        log.info(
            "%s: repeated insert %s (%d rows) for its materialized views",
            entry.table, entry.token, entry.rows,
        )  # fmt: skip

    def _last_error(self, topic: str, partition: int, offset: int) -> LastStored:
        """The `ingest_errors` record at `offset` (a point lookup: the table's sort key)."""
        [(size, prefix)] = self._rows(
            f"SELECT value_size, hex(substring(value, 1, 64)) FROM {INGEST_ERRORS.name} "
            "WHERE _topic = {topic:String} AND _partition = {partition:UInt32} "
            "AND _offset = {offset:UInt64} LIMIT 1",
            {"topic": topic, "partition": partition, "offset": offset},
        )
        return LastStored(offset, None, value_size=int(size), prefix=bytes.fromhex(prefix))

    def _stored_offsets(
        self, topic: str, table: str, partition: int, first: int, end: int
    ) -> frozenset[int]:
        """Offsets in [first, end) of one partition that have rows in a table of record."""
        params = {"topic": topic, "partition": partition, "first": first, "end": end}
        where = (
            "_topic = {topic:String} AND _partition = {partition:UInt32} "
            "AND _offset >= {first:UInt64} AND _offset < {end:UInt64}"
        )
        rows = self._rows(
            f"SELECT DISTINCT _offset FROM {table} WHERE {where} "
            f"UNION DISTINCT SELECT _offset FROM {STREAM_GAPS.name} "
            f"WHERE {where} AND detected_by = 'publisher' "
            f"UNION DISTINCT SELECT _offset FROM {INGEST_ERRORS.name} WHERE {where}",
            params,
        )
        return frozenset(int(offset) for (offset,) in rows)

    def close(self) -> None:
        """Close the client."""
        with self._lock:
            self.store.close()

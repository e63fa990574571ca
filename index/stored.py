"""Cold start: the index's state as of the stored Kafka positions, read from ClickHouse.

Three reads (SQL in `sql/index/`): where each kv-events partition's stored prefix ends,
each source's epoch, last seq and staleness within that prefix, and its resident blocks per
tier with copy counts. The index loads them and reads Kafka from exactly those positions,
so its state equals what an index that had read the whole topic would hold. On the embedded
default (chDB, one process per directory) the reads run inside `kvscope serve`, which
answers `GET /api/index/snapshot` with the same three tables (`snapshot_ipc`).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import io
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kvscope.collector.storage.client import Client
from kvscope.sql import with_includes

if TYPE_CHECKING:  # the state pulls numba in: not needed to read or ship a snapshot
    from kvscope.index.state import PrefixIndex

log = logging.getLogger(__name__)


def _sql(name: str) -> str:
    folder = importlib.resources.files("kvscope.sql").joinpath("index")

    def fragment(include: str) -> str:
        return _sql(f"_{include}")

    return with_includes(folder.joinpath(f"{name}.sql").read_text(encoding="utf-8"), fragment)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The stored state as of `positions` (partition -> next offset to read from Kafka)."""

    positions: dict[int, int]
    sources: pa.Table
    resident: pa.Table


class SnapshotReader(Protocol):
    """Where a snapshot comes from: ClickHouse directly, or a live `kvscope serve`."""

    def read(self, topic: str) -> Snapshot:
        """The stored state of `topic` (kv-events) at its stored positions."""


def read_snapshot(client: Client, topic: str) -> Snapshot:
    """Read positions, then the state below them (consistent: stored prefixes only grow)."""
    positions = client.query_arrow(_sql("positions"), parameters={"topic": topic})
    ends = {int(row["partition"]): int(row["next_offset"]) for row in positions.to_pylist()}
    params = {"topic": topic, "partitions": list(ends), "ends": list(ends.values())}
    if not ends:
        empty = pa.table({})
        return Snapshot({}, empty, empty)
    sources = client.query_arrow(_sql("sources"), parameters=params)
    resident = client.query_arrow(_sql("resident"), parameters=params)
    return Snapshot(ends, sources, resident)


class DirectReader:
    """Reads the snapshot with a ClickHouse client (a server, or a chDB directory it owns)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def read(self, topic: str) -> Snapshot:
        """See `SnapshotReader.read`."""
        return read_snapshot(self.client, topic)

    def close(self) -> None:
        """Close the client: a chDB directory is free for `kvscope collect`/`serve` again."""
        self.client.close()


def snapshot_ipc(snapshot: Snapshot) -> bytes:
    """The snapshot as one Arrow IPC stream (serve's answer to `/api/index/snapshot`):
    the resident table, with positions and sources in the schema's metadata."""
    meta = {
        b"kvscope.positions": json.dumps(snapshot.positions).encode(),
        b"kvscope.sources": json.dumps(_rows(snapshot.sources)).encode(),
    }
    table = snapshot.resident.replace_schema_metadata(meta)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def snapshot_from_ipc(data: bytes) -> Snapshot:
    """Inverse of `snapshot_ipc`."""
    table = pa.ipc.open_stream(data).read_all()
    meta = table.schema.metadata or {}
    positions = {int(k): int(v) for k, v in json.loads(meta[b"kvscope.positions"]).items()}
    sources = pa.Table.from_pylist(json.loads(meta[b"kvscope.sources"]))
    return Snapshot(positions, sources, table.replace_schema_metadata(None))


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """The sources as JSON-safe rows (epochs as strings: JSON readers may not keep u64)."""
    rows: list[dict[str, Any]] = table.to_pylist()
    for row in rows:
        row["epoch"] = str(row["epoch"])
        row["epochs"] = [str(epoch) for epoch in row["epochs"]]
    return rows


def load(index: PrefixIndex, snapshot: Snapshot) -> int:
    """Put the snapshot into `index`; returns the stored block events applied."""
    started = time.perf_counter()
    for row in snapshot.sources.to_pylist():
        index.restore_source(
            str(row["instance"]),
            int(row["dp_rank"]),
            epoch=int(row["epoch"]),
            last_seq=int(row["last_seq"]),
            stale_reason=str(row["stale_reason"] or ""),
            model=str(row["model"] or ""),
            block_size=int(row["block_size"] or 0),
            last_ts=float(row["last_ts"] or 0.0),
            retired=[int(e) for e in row["epochs"]],
        )
    events = snapshot.resident
    if events.num_rows:
        _apply_events(index, events)
    log.info(
        "loaded %d sources from %d stored block events in %.1f s",
        snapshot.sources.num_rows,
        events.num_rows,
        time.perf_counter() - started,
    )
    return int(events.num_rows)


def _apply_events(index: PrefixIndex, events: pa.Table) -> None:
    """Apply the stored events (sorted by source, then seq order), vectorized per source."""
    columns = [events.column(name).combine_chunks() for name in ("instance", "dp_rank")]
    seq = [events.column(n).to_numpy() for n in ("seq", "event_index", "position")]
    instance = pc.dictionary_encode(pc.cast(columns[0], pa.string())).indices.to_numpy()
    dp_rank = columns[1].to_numpy()
    tiers = pc.dictionary_encode(pc.cast(events.column("tier"), pa.string())).combine_chunks()
    tier_names = tiers.dictionary.to_pylist()
    tier_index = tiers.indices.to_numpy()
    hashes = events.column("block_hash").to_numpy().astype(np.uint64)
    kinds = events.column("kind").to_numpy().astype(np.int8)
    source_change = (instance[1:] != instance[:-1]) | (dp_rank[1:] != dp_rank[:-1])
    same_row = ~source_change
    for column in seq:  # a publisher retry stored the same row twice: apply it once
        same_row &= column[1:] == column[:-1]
    keep = np.concatenate(([True], ~same_row))
    starts = np.concatenate(([0], np.flatnonzero(source_change) + 1))
    ends = np.concatenate((starts[1:], [len(hashes)]))
    names = pc.cast(columns[0], pa.string())
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        name, rank = str(names[start]), int(dp_rank[start])
        slot_of = np.array(
            [index.slot_for(name, rank, tier) for tier in tier_names], dtype=np.int32
        )
        kept = keep[start:end]
        index.table.apply(
            (
                hashes[start:end][kept],
                slot_of[tier_index[start:end][kept]],
                kinds[start:end][kept],
            )
        )

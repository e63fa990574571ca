"""The table catalogue: every ClickHouse table kvscope writes or reads, named once.

The DDL lives in `sql/migrations`; this module is the only place in Python code that
spells a table name. Every other module (collector stages, migrations, the demo, the
simulator's direct sink, benchmarks) reads names, partitioning and TTL columns from here.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Final


@dataclasses.dataclass(frozen=True)
class Table:
    """One table: its name, the stream it stores (if any) and how it ages out."""

    name: str
    """Table name in the target database."""
    stream: str | None
    """The stream whose records it stores, one row per record or per block hash."""
    ttl_time: str
    """Time expression the retention TTL counts from ('' = none: small derived state)."""
    partitioned_by_day: bool
    """PARTITION BY toDate(ts): an insert must not span days to stay one part."""


KV_BLOCK_EVENTS: Final = Table("kv_block_events", "kv-events", "toDateTime(ts)", True)
ENGINE_STATS: Final = Table("engine_stats", "engine-stats", "toDateTime(ts)", True)
REQUESTS: Final = Table("requests", "requests", "toDateTime(ts)", True)
KV_TRANSFERS: Final = Table("kv_transfers", "kv-transfers", "toDateTime(ts)", True)
ENGINE_HISTOGRAMS: Final = Table("engine_histograms", "engine-histograms", "toDateTime(ts)", True)
KV_ACCESSES: Final = Table("kv_accesses", "kv-accesses", "toDateTime(ts)", True)
"""Opt-in access stream: per request, the hashes it looked up and its hits (migration 004)."""
STREAM_GAPS: Final = Table("stream_gaps", None, "toDateTime(ts)", False)
"""Lost seq ranges (publisher Gaps and holes the collector saw)."""
INGEST_ERRORS: Final = Table("ingest_errors", None, "toDateTime(ingested_at)", False)
"""Records that could not be decoded, with their raw bytes."""
KV_TRANSFER_LATENCY_1M: Final = Table("kv_transfer_latency_1m", None, "minute", False)
"""Per-minute transfer latency aggregates (materialized view target)."""
KV_BLOCK_EVENTS_1M: Final = Table("kv_block_events_1m", None, "minute", False)
"""Per-minute store/removal/clear counts (materialized view target)."""
INGEST_BATCHES: Final = Table("ingest_batches", None, "toDateTime(written_at)", False)
"""Offset ranges of batches stored out of offset order (see `kvscope.collector.pipeline.plan`)."""
INGEST_INSERTS: Final = Table("ingest_inserts", None, "toDateTime(written_at)", False)
"""Per Kafka partition, its latest flush into view-feeding tables (`pipeline.journal`)."""
KV_BLOCK_INTERVALS: Final = Table("kv_block_intervals", None, "toDateTime(end_ts)", True)
"""Closed residency intervals, derived from kv_block_events (`storage.residency`)."""
KV_BLOCK_INTERVALS_BY_HASH: Final = Table(
    "kv_block_intervals_by_hash", None, "toDateTime(end_ts)", True
)
"""The closed intervals again, in block-hash order, for routing_opportunity (derived)."""
KV_BLOCK_OPEN: Final = Table("kv_block_open", None, "", False)
"""Open residency intervals (blocks resident now), derived."""
KV_BLOCK_EVICTED: Final = Table("kv_block_evicted", None, "", False)
"""Each hash's last BlockRemoved per source, derived (refault lookups)."""
KV_RESIDENCY_PROGRESS: Final = Table("kv_residency_progress", None, "", False)
"""Per source and epoch: how far the residency tables are derived (the commit record)."""
MIGRATIONS: Final = "kvscope_migrations"
"""Applied migration versions (see `kvscope.collector.storage.migrate`)."""

RAW: Final = (
    KV_BLOCK_EVENTS,
    ENGINE_STATS,
    REQUESTS,
    KV_TRANSFERS,
    ENGINE_HISTOGRAMS,
    KV_ACCESSES,
    STREAM_GAPS,
    INGEST_ERRORS,
)
"""Tables the collector inserts into (the source of truth)."""
AGGREGATES: Final = (KV_TRANSFER_LATENCY_1M, KV_BLOCK_EVENTS_1M)
"""Tables kept by materialized views."""
VIEW_SOURCES: Final = frozenset((KV_BLOCK_EVENTS.name, KV_TRANSFERS.name))
"""Raw tables whose inserts feed materialized views (their inserts are journaled)."""
RESIDENCY: Final = (
    KV_BLOCK_INTERVALS,
    KV_BLOCK_INTERVALS_BY_HASH,
    KV_BLOCK_OPEN,
    KV_BLOCK_EVICTED,
    KV_RESIDENCY_PROGRESS,
)
"""Tables derived from kv_block_events by `kvscope.collector.storage.residency`; the
`*_stage` tables beside them (migration 003) hold one refresh step before it is published."""
STREAM_TABLES: Final = MappingProxyType({t.stream: t.name for t in RAW if t.stream is not None})
"""Stream name -> the raw table storing it (the streams the collector can collect)."""
PARTITIONED_BY_DAY: Final = frozenset(t.name for t in RAW if t.partitioned_by_day)
"""Tables whose inserts are split per day so that each insert stays one part."""

"""Test helpers for the collector: a plain aiokafka publisher and envelope generators.

The real kvscope publisher is tested on its own; these tests only need records on the
broker, so they use a bare aiokafka producer and `kvscope.schemas.encode`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import (
    AllBlocksCleared,
    AnyBody,
    BlockRemoved,
    BlockStored,
    Envelope,
    Gap,
    KVEventBatch,
    Source,
    encode,
    topic_for,
)

MAX_RECORD = 16 * 1024 * 1024


def envelope(source: Source, epoch: int, seq: int, ts: float, body: AnyBody) -> Envelope:
    """An envelope with every field given."""
    return Envelope(source=source, epoch=epoch, seq=seq, ts=ts, body=body)


async def publish(
    bootstrap_servers: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]]
) -> int:
    """Send (key, value) records to `topic` and wait for all acks; returns the count."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers, max_request_size=MAX_RECORD, linger_ms=5
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


def envelope_records(envelopes: Iterable[Envelope]) -> list[tuple[bytes, bytes]]:
    """(key, value) records of `envelopes`, keyed by source like the real publisher."""
    return [(e.source.key.encode(), encode(e)) for e in envelopes]


async def publish_envelopes(
    bootstrap_servers: str, prefix: str, stream: str, envelopes: Sequence[Envelope]
) -> int:
    """Publish envelopes of one stream, keyed by source like the real publisher."""
    records = envelope_records(envelopes)
    return await publish(bootstrap_servers, topic_for(stream, prefix), records)


def kv_envelopes(
    source: Source,
    epoch: int,
    records: int,
    events_per_record: int = 4,
    hashes_per_event: int = 8,
    seed: int = 0,
    start_seq: int = 0,
    t0: float = 1_763_700_000.0,
) -> list[Envelope]:
    """Deterministic KV-event batches: stores, removals and an occasional clear."""
    rng = random.Random(seed)
    out = []
    for i in range(records):
        events: list[Any] = []
        for _ in range(events_per_record):
            hashes = [rng.getrandbits(64) for _ in range(hashes_per_event)]
            roll = rng.random()
            if roll < 0.6:
                events.append(
                    BlockStored(
                        block_hashes=hashes,
                        parent_block_hash=rng.choice([None, rng.getrandbits(64)]),
                        block_size=16,
                        token_count=16 * hashes_per_event - rng.randrange(16),
                        medium=rng.choice(["GPU", "CPU"]),
                    )
                )
            elif roll < 0.98:
                events.append(BlockRemoved(block_hashes=hashes, medium="GPU"))
            else:
                events.append(AllBlocksCleared())
        ts = t0 + i * 0.01
        out.append(envelope(source, epoch, start_seq + i, ts, KVEventBatch(ts=ts, events=events)))
    return out


def kv_row_count(envelopes: Iterable[Envelope]) -> int:
    """Rows these KV-event envelopes become in kv_block_events (Gap records become none)."""
    return sum(
        1 if isinstance(ev, AllBlocksCleared) else len(ev.block_hashes)
        for e in envelopes
        if isinstance(e.body, KVEventBatch)
        for ev in e.body.events
    )


GapRow = tuple[str, str, int, int, int]
"""A stream_gaps row as (instance, detected_by, first_seq, last_seq, seq)."""


def punch_holes(
    envelopes: Sequence[Envelope], holes: Sequence[tuple[int, int, bool]]
) -> tuple[list[Envelope], list[GapRow]]:
    """Remove seqs first..last of one source's contiguous stream, for each hole.

    With `declared` the record right after the hole becomes a publisher `Gap` naming it
    (it keeps that seq, as a real publisher's Gap takes a seq of its own); otherwise the
    hole is silent. Returns the new stream and the stream_gaps rows it must leave, derived
    from the construction: one `collector` row per hole (revealed by the record after it)
    and one `publisher` row per declared hole. Holes must not touch each other or the end.
    """
    by_seq = {e.seq: e for e in envelopes}
    removed: set[int] = set()
    replaced: dict[int, Envelope] = {}
    rows: list[GapRow] = []
    for first, last, declared in holes:
        after = by_seq[last + 1]
        if removed & set(range(first - 1, last + 3)) or after.seq in replaced:
            raise ValueError(f"hole {first}..{last} touches another hole")
        removed.update(range(first, last + 1))
        instance = after.source.instance
        rows.append((instance, "collector", first, last, after.seq))
        if declared:
            body = Gap(first_seq=first, last_seq=last, reason="injected")
            replaced[after.seq] = envelope(after.source, after.epoch, after.seq, after.ts, body)
            rows.append((instance, "publisher", first, last, after.seq))
    kept = [replaced.get(e.seq, e) for e in envelopes if e.seq not in removed]
    return kept, rows


SESSION_TIMEOUT_MS = 2000
"""Group session timeout for the tests' consumers. The local broker (Tansu) answers a
JoinGroup only once half the session timeout has passed, in whole-second steps: 3000 ms
cost 2 s per group join, 2000 ms cost 1 s (1000 ms would cost the same)."""


def collector_config(
    bootstrap_servers: str, clickhouse_url: str, prefix: str, **overrides: Any
) -> CollectorConfig:
    """A collector config for tests: short group timeouts, small batches."""
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "target": parse_target(clickhouse_url),
        "group": f"g-{prefix}",
        "topic_prefix": prefix,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "batch_rows": 50_000,
        "batch_seconds": 0.3,
        "exit_when_idle": 2.0,
        "retry_initial_s": 0.05,
        "retry_max_s": 0.5,
    }
    settings.update(overrides)
    return CollectorConfig(**settings)


class SinkWrapper:
    """Base of test sinks wrapping the real `ClickHouseSink` (they override `insert`)."""

    def __init__(self, real: ClickHouseSink) -> None:
        self.real = real

    def insert(self, insert: Insert) -> None:
        """Pass the insert to the real sink."""
        self.real.insert(insert)

    def resume_state(self, topic: str, table: str, partitions: Sequence[int]) -> Any:
        """Pass the lookup to the real sink."""
        return self.real.resume_state(topic, table, partitions)


async def until(condition: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Wait for observable state: poll `condition` (in a thread) until it holds.

    The timeout is a generous bound that fails with `what`, never a measurement.
    """
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.05)

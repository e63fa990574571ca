"""Collector throughput, broker -> chDB, on one core: the vectorized collector vs a baseline.

Publishes N block events (KV-event batches, by default 8 events x 8 hashes) to the local broker,
then, pinned to one CPU core (the broker runs on another), measures in one run:

- kvscope: `Collector` (consumer group, msgspec decode, numpy/Arrow columns, Arrow
  inserts with deduplication tokens, commit after insert);
- baseline: the straightforward consumer: per-record decode, one Python tuple per block
  hash, `client.insert()` row-wise with clickhouse-connect, same batch size;
- kvscope+residency (with `--with-residency`): the collector as it runs by default, also
  keeping the materialized residency current (a refresh at most every
  `--residency-interval` seconds and one when it goes quiet); its clock stops when the
  last refresh has derived every stored event. The plain `kvscope` side runs with the
  residency off.

Both start their clock when their first record arrives and stop it when the last row is
stored. With `--repeat N` the pair runs N times (fresh databases, alternating order) and
the median of each is reported. Usage: python bench/collector_throughput.py [--events 2000000]
[--batch-rows 500000] [--repeat 3] [--events-per-record 8] [--hashes-per-event 8]
[--with-residency] [--residency-interval 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage import tables
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import store_for
from kvscope.collector.storage.target import connect, parse_target
from kvscope.local.broker import LocalBroker
from kvscope.schemas import (
    BlockRemoved,
    BlockStored,
    Envelope,
    KVEventBatch,
    Source,
    decode,
    encode,
    topic_for,
)

PREFIX = "bench."
SIDES = ["kvscope", "baseline"]
RESIDENCY = "kvscope+residency"
KV_COLUMNS = [
    "instance", "dp_rank", "model", "role", "engine", "epoch", "seq", "ts", "event_index",
    "position", "event", "block_hash", "parent_hash", "block_size", "tokens", "medium",
    "medium_raw", "lora_name", "group_idx", "_topic", "_partition", "_offset",
]  # fmt: skip


def kv_event_batch(
    rng: random.Random, ts: float, events: int = 8, hashes_per_event: int = 8
) -> KVEventBatch:
    """One KV-event batch: `events` events of random block hashes, every third a removal."""
    out: list[Any] = []
    for e in range(events):
        hashes = [rng.getrandbits(64) for _ in range(hashes_per_event)]
        if e % 3 == 2:
            out.append(BlockRemoved(block_hashes=hashes))
        else:
            out.append(BlockStored(block_hashes=hashes, block_size=16, token_count=128))
    return KVEventBatch(ts, out)


def make_records(
    events: int, events_per_record: int = 8, hashes_per_event: int = 8
) -> list[tuple[bytes, bytes]]:
    """Encoded KV-event batches holding `events` block hashes, from 8 sources."""
    rng = random.Random(7)
    sources = [Source(instance=f"bench-{i}", model="m") for i in range(8)]
    per_record = events_per_record * hashes_per_event
    out = []
    for n in range(events // per_record):
        source = sources[n % len(sources)]
        ts = 1_763_700_000.0 + n * 0.001
        body = kv_event_batch(rng, ts, events_per_record, hashes_per_event)
        env = Envelope(source=source, epoch=1, seq=n // len(sources), ts=ts, body=body)
        out.append((source.key.encode(), encode(env)))
    return out


async def publish(bootstrap: str, records: list[tuple[bytes, bytes]]) -> None:
    """Send all records (lz4) and wait for every ack."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, compression_type="lz4", max_batch_size=1 << 20
    )
    await producer.start()
    try:
        topic = topic_for("kv-events", PREFIX)
        futures = [await producer.send(topic, value=v, key=k) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


class TimingSink:
    """Forwards to the real sink; notes when the first insert starts and the last ends."""

    def __init__(self, real: ClickHouseSink) -> None:
        self.real = real
        self.rows = 0
        self.refreshes = 0
        self.last_end = 0.0
        self.last_cpu = 0.0

    def insert(self, insert: Insert) -> None:
        self.real.insert(insert)
        self.rows += insert.rows.num_rows
        self._stamp()

    def refresh_residency(self) -> None:
        self.real.refresh_residency()
        self.refreshes += 1
        self._stamp()

    def _stamp(self) -> None:
        self.last_end = time.perf_counter()
        self.last_cpu = time.process_time()

    def resume_state(self, topic: str, table: str, partitions: Any) -> Any:
        return self.real.resume_state(topic, table, partitions)


Rate = tuple[float, float]
"""(block events per wall second, block events per CPU second of this process)."""


async def run_kvscope(
    bootstrap: str,
    client: Any,
    target: Any,
    batch_rows: int,
    group: str,
    residency_interval_s: float | None = None,
) -> Rate:
    """Block events/s of the vectorized collector (keeping the residency current every
    `residency_interval_s` seconds, or not at all when None)."""
    sink = TimingSink(ClickHouseSink(store_for(target, client)))
    config = CollectorConfig(
        bootstrap_servers=bootstrap,
        target=target,
        group=group,
        topic_prefix=PREFIX,
        streams=("kv-events",),
        batch_rows=batch_rows,
        batch_seconds=0.5,
        max_poll_records=5_000,
        exit_when_idle=3.0,
        session_timeout_ms=6000,
        residency=residency_interval_s is not None,
        residency_interval_s=residency_interval_s or 0.0,
    )
    collector = Collector(config, sink=sink)
    original = collector._add
    first: list[tuple[float, float]] = []

    def timed_add(data: Any) -> None:
        if data and not first:
            first.append((time.perf_counter(), time.process_time()))
        original(data)

    collector._add = timed_add  # type: ignore[method-assign]
    await collector.run()
    if residency_interval_s is not None:
        print(f"          {sink.refreshes} residency refreshes", flush=True)
    wall, cpu = first[0]
    return sink.rows / (sink.last_end - wall), sink.rows / (sink.last_cpu - cpu)


async def run_baseline(bootstrap: str, client: Any, batch_rows: int) -> Rate:
    """Block events/s of the straightforward consumer (row-wise)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=64 << 20
    )
    await consumer.start()
    topic = topic_for("kv-events", PREFIX)
    ids = consumer.partitions_for_topic(topic) or set()
    partitions = [TopicPartition(topic, p) for p in sorted(ids)]
    consumer.assign(partitions)
    await consumer.seek_to_beginning(*partitions)
    rows: list[tuple] = []
    stored = 0
    first = first_cpu = last_end = last_cpu = 0.0
    idle_since = time.perf_counter()
    try:
        while True:
            data = await consumer.getmany(timeout_ms=200, max_records=20_000)
            if not data:
                if rows:
                    client.insert(tables.KV_BLOCK_EVENTS.name, rows, column_names=KV_COLUMNS)
                    stored += len(rows)
                    rows = []
                    last_end, last_cpu = time.perf_counter(), time.process_time()
                if time.perf_counter() - idle_since > 3.0:
                    break
                continue
            idle_since = time.perf_counter()
            if not first:
                first, first_cpu = time.perf_counter(), time.process_time()
            for tp, records in data.items():
                for record in records:
                    env = decode(record.value)
                    src = env.source
                    ts = datetime.fromtimestamp(env.ts, UTC)
                    for ei, ev in enumerate(env.body.events):
                        stored_ev = isinstance(ev, BlockStored)
                        for pos, h in enumerate(ev.block_hashes):
                            parent = ev.block_hashes[pos - 1] if pos else 0
                            rows.append((
                                src.instance, src.dp_rank, src.model, src.role, src.engine,
                                env.epoch, env.seq, ts, ei, pos, 1 if stored_ev else 2, h,
                                parent, ev.block_size if stored_ev else 0,
                                16 if stored_ev else 0, ev.medium, "", "", -1,
                                tp.topic, tp.partition, record.offset,
                            ))  # fmt: skip
            if len(rows) >= batch_rows:
                client.insert(tables.KV_BLOCK_EVENTS.name, rows, column_names=KV_COLUMNS)
                stored += len(rows)
                rows = []
                last_end, last_cpu = time.perf_counter(), time.process_time()
    finally:
        await consumer.stop()
    return stored / (last_end - first), stored / (last_cpu - first_cpu)


def _run(
    name: str, bootstrap: str, url: str, batch_rows: int, events: int, interval_s: float
) -> Rate:
    """One measured run of `name` into the fresh database at `url`."""
    target = parse_target(url)
    client = connect(target)
    try:
        migrate(client, target)
        if name == "baseline":
            rate = asyncio.run(run_baseline(bootstrap, client, batch_rows))
        else:
            group = f"bench-{target.database}"
            interval = interval_s if name == RESIDENCY else None
            rate = asyncio.run(run_kvscope(bootstrap, client, target, batch_rows, group, interval))
        count = client.query(f"SELECT count() FROM {tables.KV_BLOCK_EVENTS.name}").result_rows[0][0]
        assert count == events, f"{name}: stored {count} of {events}"
        if name == RESIDENCY:
            derived = client.query(
                "SELECT sum(e) FROM (SELECT argMax(events, generation) AS e "
                f"FROM {tables.KV_RESIDENCY_PROGRESS.name} GROUP BY instance, dp_rank, epoch)"
            ).result_rows[0][0]
            assert derived == events, f"{name}: derived {derived} of {events}"
    finally:
        client.close()
    print(
        f"{name:17s} {rate[0]:11,.0f} block events/s wall, "
        f"{rate[1]:11,.0f} per CPU-second ({events:,} events)",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--events-per-record", type=int, default=8)
    parser.add_argument("--hashes-per-event", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side (median)")
    parser.add_argument("--core", type=int, default=0, help="CPU core for the collectors")
    parser.add_argument("--only", choices=[*SIDES, RESIDENCY], help="run one side (profiling)")
    parser.add_argument(
        "--with-residency", action="store_true", help=f"also run the {RESIDENCY} side"
    )
    parser.add_argument(
        "--residency-interval",
        type=float,
        default=CollectorConfig().residency_interval_s,
        help="the kvscope+residency side's refresh interval in seconds (default: %(default)s)",
    )
    args = parser.parse_args()

    records = make_records(args.events, args.events_per_record, args.hashes_per_event)
    events = len(records) * args.events_per_record * args.hashes_per_event
    names = [args.only] if args.only else [*SIDES, *([RESIDENCY] if args.with_residency else [])]
    results: dict[str, list[Rate]] = {name: [] for name in names}
    with LocalBroker() as broker, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        asyncio.run(publish(broker.bootstrap_servers, records))
        os.sched_setaffinity(0, {args.core})
        for rep in range(args.repeat):
            for name in names if rep % 2 == 0 else names[::-1]:
                url = f"chdb://{tmp}/ch?database=bench_{name.replace('+', '_')}_{rep}"
                rate = _run(
                    name,
                    broker.bootstrap_servers,
                    url,
                    args.batch_rows,
                    events,
                    args.residency_interval,
                )
                results[name].append(rate)
    medians = {
        name: tuple(statistics.median(r[i] for r in rates) for i in range(2))
        for name, rates in results.items()
    }
    if args.repeat > 1:
        for name, (wall, cpu) in medians.items():
            print(f"median    {name}: {wall:,.0f} wall, {cpu:,.0f} per CPU-second")
    ratios = [(name, "baseline") for name in medians if name != "baseline"]
    ratios += [(RESIDENCY, "kvscope")] if {RESIDENCY, "kvscope"} <= medians.keys() else []
    for name, base in ratios:
        if base in medians:
            wall = medians[name][0] / medians[base][0]
            cpu = medians[name][1] / medians[base][1]
            print(f"ratio     {name} / {base}: {wall:.2f}x wall, {cpu:.2f}x per CPU-second")
    print(f"machine   {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"one core pinned; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip


if __name__ == "__main__":
    main()

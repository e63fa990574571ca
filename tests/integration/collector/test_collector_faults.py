"""The sink fails for a while: no loss, no duplicates, bounded memory, resumes by itself."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import metrics
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import Source
from support.collector_testkit import (
    SinkWrapper,
    collector_config,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
)


class FaultInjectingSink(SinkWrapper):
    """Fault injector at the writer boundary (not a stand-in: it wraps the real sink).

    A real ClickHouse cannot be made to fail on demand, so this wrapper fails inserts
    `fail_from`..`fail_to` (counting attempts): odd attempts fail before reaching
    ClickHouse, even ones after the insert landed (the client saw an error, the rows
    are stored), which is exactly the case deduplication tokens must cover.
    """

    def __init__(self, real: ClickHouseSink, fail_from: int, fail_to: int, probe: Any) -> None:
        super().__init__(real)
        self.fail_from = fail_from
        self.fail_to = fail_to
        self.probe = probe
        self.attempts = 0
        self.failures = 0
        self.max_pending = 0
        self.max_paused = 0.0
        self._lock = threading.Lock()

    def insert(self, insert: Insert) -> None:
        with self._lock:
            self.attempts += 1
            attempt = self.attempts
            self.max_pending = max(self.max_pending, self.probe().pending_rows)
            self.max_paused = max(self.max_paused, metrics.PAUSED_PARTITIONS._value.get())
        if self.fail_from <= attempt <= self.fail_to:
            self.failures += 1
            if attempt % 2 == 0:
                self.real.insert(insert)
            raise SinkError(f"injected failure on attempt {attempt}")
        self.real.insert(insert)


def test_sink_failures_lose_and_double_nothing(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sources = [Source(instance=f"f{i}", dp_rank=i) for i in range(3)]
    envelopes = [e for i, s in enumerate(sources) for e in kv_envelopes(s, 5, 300, seed=i)]
    batch_rows = 2_000
    config = collector_config(
        bootstrap_servers, clickhouse_url, topic_prefix, batch_rows=batch_rows, max_poll_records=50
    )
    collector: Collector | None = None
    sink = FaultInjectingSink(ClickHouseSink(ChdbStore(clickhouse)), 3, 14, probe=lambda: collector)

    async def scenario() -> None:
        nonlocal collector
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes)
        collector = Collector(config, sink=sink)
        await collector.run()

    asyncio.run(scenario())

    assert sink.failures == 12
    assert sink.max_paused > 0
    per_record = 4 * 8
    assert sink.max_pending <= batch_rows + 2 * 50 * per_record
    expected = kv_row_count(envelopes)
    total, distinct = clickhouse.query(
        "SELECT count(), uniqExact(instance, seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (expected, expected)
    agg = clickhouse.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows
    assert agg == [(expected,)]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]


class BrokenResume(SinkWrapper):
    """Fault injector (wraps the real sink): looking up where stored records end fails
    for good, as a ClickHouse that refuses the collector's reads would."""

    def resume_state(self, topic: str, table: str, partitions: Any) -> Any:
        raise SinkError("injected: the stored offsets cannot be read", retriable=False)


def test_an_assignment_that_cannot_be_positioned_stops_the_collector(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    """aiokafka only logs a rebalance listener's exception: the partitions stayed paused
    and unpositioned, and the collector waited for ever, never idle, storing nothing. Now
    its run ends with the error."""
    migrate(clickhouse, parse_target(clickhouse_url))
    config = collector_config(bootstrap_servers, clickhouse_url, topic_prefix)

    async def scenario() -> None:
        envelopes = kv_envelopes(Source(instance="p"), 1, 10)
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes)
        collector = Collector(config, sink=BrokenResume(ClickHouseSink(ChdbStore(clickhouse))))
        await asyncio.wait_for(collector.run(), timeout=60)

    with pytest.raises(SinkError, match="stored offsets cannot be read"):
        asyncio.run(scenario())


def test_a_committed_offset_the_broker_cannot_give_is_not_needed(
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reading the group's committed offsets fails (a fault injected into aiokafka's
    consumer: a real broker returns such errors only while its group state is in flux):
    every record is still stored once, resumed from the stored offsets, and the log names
    the offset reading resumes at (the last stored one, read again to check the log)."""
    migrate(clickhouse, parse_target(clickhouse_url))
    envelopes = kv_envelopes(Source(instance="c"), 1, 40)
    config = collector_config(bootstrap_servers, clickhouse_url, topic_prefix)
    failed = []

    async def committed(self: AIOKafkaConsumer, tp: Any) -> int | None:
        failed.append(tp)
        raise KafkaError("injected: OffsetFetch failed")

    async def scenario() -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes)
        await Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse))).run()

    asyncio.run(scenario())  # stores everything, commits it
    monkeypatch.setattr(AIOKafkaConsumer, "committed", committed)
    more = kv_envelopes(Source(instance="c"), 1, 40, seed=1, start_seq=40)
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", more))
    [(partition, last_offset)] = clickhouse.query(
        "SELECT _partition, max(_offset) FROM kv_block_events GROUP BY _partition"
    ).result_rows
    collector = Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse)))
    with caplog.at_level(logging.INFO, logger="kvscope.collector.pipeline.consume"):
        asyncio.run(asyncio.wait_for(collector.run(), timeout=60))

    assert failed
    assert (
        f"assigned {topic_prefix}kv-events[{partition}]: committed None, "
        f"last stored offset {last_offset}, resuming at {last_offset}"
    ) in caplog.messages
    expected = kv_row_count(envelopes) + kv_row_count(more)
    assert clickhouse.query(
        "SELECT count(), uniqExact(seq, event_index, position), max(seq) FROM kv_block_events"
    ).result_rows == [(expected, expected, 79)]

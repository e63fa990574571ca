"""Two collectors in one group, one process, one shared ClickHouse client: exact counts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import metrics
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink, Insert
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import Source
from support.collector_testkit import (
    SinkWrapper,
    collector_config,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
)


class CountingSink(SinkWrapper):
    """Passes everything to the shared real sink and counts the rows this member stored."""

    def __init__(self, real: ClickHouseSink) -> None:
        super().__init__(real)
        self.rows = 0

    def insert(self, insert: Insert) -> None:
        self.real.insert(insert)
        self.rows += insert.rows.num_rows


def test_two_members_share_partitions_through_rebalances(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sources = [Source(instance=f"rb{i}", dp_rank=i) for i in range(8)]
    phases = [
        [e for i, s in enumerate(sources) for e in kv_envelopes(s, 3, 60, seed=i, start_seq=p * 60)]
        for p in range(4)
    ]
    expected = sum(kv_row_count(p) for p in phases)
    config = collector_config(
        bootstrap_servers, clickhouse_url, topic_prefix, exit_when_idle=None, batch_rows=3_000
    )
    shared = ClickHouseSink(clickhouse)
    sinks = [CountingSink(shared), CountingSink(shared)]

    def stored() -> int:
        return int(clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0])

    async def scenario() -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[0])
        first = Collector(config, sink=sinks[0])
        first_run = asyncio.create_task(first.run())
        await asyncio.sleep(3)
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[1])
        second = Collector(config, sink=sinks[1])
        second_run = asyncio.create_task(second.run())
        await asyncio.sleep(4)
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[2])
        await asyncio.sleep(0.5)
        first.request_stop()
        await first_run
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[3])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and await asyncio.to_thread(stored) < expected:
            await asyncio.sleep(0.5)
        second.request_stop()
        await second_run

    asyncio.run(scenario())

    assert sinks[0].rows > 0
    assert sinks[1].rows > 0
    total, distinct = clickhouse.query(
        "SELECT count(), uniqExact(instance, seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (expected, expected)
    assert sum(s.rows for s in sinks) == expected
    agg = clickhouse.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows
    assert agg == [(expected,)]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]


class FailingUntil(SinkWrapper):
    """Fault injector at the writer boundary: every insert fails until `recover()`.

    A real ClickHouse cannot be told to fail for a while; this wraps the real sink.
    """

    def __init__(self, real: ClickHouseSink, probes: list[Collector]) -> None:
        super().__init__(real)
        self.failing = True
        self.probes = probes
        self.max_pending = 0

    def insert(self, insert: Insert) -> None:
        self.max_pending = max([self.max_pending, *(c.pending_rows for c in self.probes)])
        if self.failing:
            raise SinkError("injected: ClickHouse is down")
        self.real.insert(insert)


def test_rebalance_while_the_sink_is_failing(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sources = [Source(instance=f"rf{i}", dp_rank=i) for i in range(8)]
    envelopes = [e for i, s in enumerate(sources) for e in kv_envelopes(s, 1, 100, seed=i)]
    expected = kv_row_count(envelopes)
    batch_rows = 2_000
    config = collector_config(
        bootstrap_servers,
        clickhouse_url,
        topic_prefix,
        exit_when_idle=None,
        batch_rows=batch_rows,
        max_poll_records=20,
    )
    collectors: list[Collector] = []
    sink = FailingUntil(ClickHouseSink(clickhouse), collectors)

    def stored() -> int:
        return int(clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0])

    async def scenario() -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes)
        collectors.append(Collector(config, sink=sink))
        runs = [asyncio.create_task(collectors[0].run())]
        await asyncio.sleep(3)
        collectors.append(Collector(config, sink=sink))
        runs.append(asyncio.create_task(collectors[1].run()))
        await asyncio.sleep(5)
        assert metrics.PAUSED_PARTITIONS._value.get() > 0
        sink.failing = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and await asyncio.to_thread(stored) < expected:
            await asyncio.sleep(0.5)
        for collector in collectors:
            collector.request_stop()
        await asyncio.gather(*runs)

    asyncio.run(scenario())

    total, distinct = clickhouse.query(
        "SELECT count(), uniqExact(instance, seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (expected, expected)
    assert sink.max_pending <= batch_rows + 2 * 20 * 4 * 8
    assert metrics.PAUSED_PARTITIONS._value.get() == 0

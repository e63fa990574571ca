"""Two collectors in one group, one process, one shared ClickHouse client: exact counts.

The streams carry holes (silent and Gap-declared), some revealed only after their
partition changed hands, so each must be found once from the state the new owner
restores. Every step waits for observable state (rows stored, partitions assigned,
inserts pending), never for a fixed time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import metrics
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import Envelope, Source, topic_for
from support.collector_testkit import (
    SinkWrapper,
    collector_config,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
    punch_holes,
    until,
)


class CountingSink(SinkWrapper):
    """Passes everything to the shared real sink and counts the rows this member stored."""

    def __init__(self, real: ClickHouseSink) -> None:
        super().__init__(real)
        self.rows = 0

    def insert(self, insert: Insert) -> None:
        self.real.insert(insert)
        self.rows += insert.rows.num_rows


PHASE = 60
"""Records per source and phase; phase p holds seqs 60p..60p+59."""
HOLES = [(10, 11, False), (58, 62, True), (120, 121, False), (150, 150, True), (180, 182, True)]
"""Per source (first, last, declared by a Gap); three start in one phase and are revealed in
the next (maybe by the other member, from the state it restores)."""


def _gap_rows(clickhouse: Any) -> Counter:
    rows = clickhouse.query(
        "SELECT instance, detected_by, first_seq, last_seq, seq FROM stream_gaps"
    ).result_rows
    return Counter((str(i), str(d), int(a), int(b), int(s)) for i, d, a, b, s in rows)


def _kv_partitions(collector: Collector, topic: str) -> set[int]:
    """Partitions of `topic` the member owns and has positioned (none before it joined)."""
    if not collector.source.joined:
        return set()
    return {tp.partition for tp in collector.source.assignment() if tp.topic == topic}


def test_two_members_share_partitions_through_rebalances(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sources = [Source(instance=f"rb{i}", dp_rank=i) for i in range(8)]
    phases: list[list[Envelope]] = [[] for _ in range(4)]
    gap_rows: Counter = Counter()
    for i, source in enumerate(sources):
        stream, rows = punch_holes(kv_envelopes(source, 3, 4 * PHASE, seed=i), HOLES)
        gap_rows.update(rows)
        for e in stream:
            phases[e.seq // PHASE].append(e)
    upto = [sum(kv_row_count(p) for p in phases[: k + 1]) for k in range(4)]
    config = collector_config(
        bootstrap_servers, clickhouse_url, topic_prefix, exit_when_idle=None, batch_rows=3_000
    )
    kv_topic = topic_for("kv-events", topic_prefix)
    shared = ClickHouseSink(ChdbStore(clickhouse))
    sinks = [CountingSink(shared), CountingSink(shared)]

    def stored() -> int:
        return int(clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0])

    async def scenario() -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[0])
        first = Collector(config, sink=sinks[0])
        first_run = asyncio.create_task(first.run())
        await until(lambda: stored() == upto[0], "the first member to store phase 0")
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[1])
        second = Collector(config, sink=sinks[1])
        second_run = asyncio.create_task(second.run())
        await until(
            lambda: _kv_partitions(first, kv_topic) and _kv_partitions(second, kv_topic),
            "both members to own kv-events partitions",
        )
        await until(lambda: stored() == upto[1], "phase 1 to be stored")
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[2])
        await until(lambda: stored() > upto[1], "phase 2 to start arriving")
        first.request_stop()
        await first_run
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", phases[3])
        await until(lambda: stored() == upto[3], "every phase to be stored")
        await until(lambda: _gap_rows(clickhouse) == gap_rows, "every hole's gap row")
        second.request_stop()
        await second_run

    asyncio.run(scenario())

    assert sinks[0].rows > 0
    assert sinks[1].rows > 0
    total, distinct = clickhouse.query(
        "SELECT count(), uniqExact(instance, seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (upto[3], upto[3])
    agg = clickhouse.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows
    assert agg == [(upto[3],)]
    assert _gap_rows(clickhouse) == gap_rows
    assert len(gap_rows) == len(sources) * (len(HOLES) + sum(d for *_, d in HOLES))


class FailingUntil(SinkWrapper):
    """Fault injector at the writer boundary: every insert fails while `failing` is set.

    A real ClickHouse cannot be told to fail for a while; this wraps the real sink.
    """

    def __init__(self, real: ClickHouseSink, probes: list[Collector]) -> None:
        super().__init__(real)
        self.failing = True
        self.failures = 0
        self.probes = probes
        self.max_pending = 0

    def insert(self, insert: Insert) -> None:
        self.max_pending = max([self.max_pending, *(c.pending_rows for c in self.probes)])
        if self.failing:
            self.failures += 1
            raise SinkError("injected: ClickHouse is down")
        self.real.insert(insert)


def test_rebalance_while_the_sink_is_failing(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sources = [Source(instance=f"rf{i}", dp_rank=i) for i in range(8)]
    envelopes: list[Envelope] = []
    gap_rows: Counter = Counter()
    for i, source in enumerate(sources):
        holes = [(5, 6, False), (40, 42, True), (77, 77, False)]
        stream, rows = punch_holes(kv_envelopes(source, 1, 100, seed=i), holes)
        envelopes += stream
        gap_rows.update(rows)
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
    kv_topic = topic_for("kv-events", topic_prefix)
    collectors: list[Collector] = []
    sink = FailingUntil(ClickHouseSink(ChdbStore(clickhouse)), collectors)

    def stored() -> int:
        return int(clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0])

    async def scenario() -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes)
        collectors.append(Collector(config, sink=sink))
        runs = [asyncio.create_task(collectors[0].run())]
        await until(lambda: sink.failures > 0, "the first member's inserts to fail")
        collectors.append(Collector(config, sink=sink))
        runs.append(asyncio.create_task(collectors[1].run()))
        await until(
            lambda: all(_kv_partitions(c, kv_topic) for c in collectors),
            "both members to own kv-events partitions",
        )
        failed_before = sink.failures
        await until(
            lambda: sink.failures >= failed_before + 2 and all(c.pending_rows for c in collectors),
            "both members to hold rows while inserts keep failing",
        )
        assert metrics.PAUSED_PARTITIONS._value.get() > 0
        sink.failing = False
        await until(lambda: stored() == expected, "every row to be stored after recovery")
        await until(lambda: _gap_rows(clickhouse) == gap_rows, "every hole's gap row")
        for collector in collectors:
            collector.request_stop()
        await asyncio.gather(*runs)

    asyncio.run(scenario())

    total, distinct = clickhouse.query(
        "SELECT count(), uniqExact(instance, seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (expected, expected)
    assert _gap_rows(clickhouse) == gap_rows
    assert sink.max_pending <= batch_rows + 2 * 20 * 4 * 8
    assert metrics.PAUSED_PARTITIONS._value.get() == 0

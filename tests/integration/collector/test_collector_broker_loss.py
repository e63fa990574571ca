"""A broker that restarts without its log (offsets start again at 0): new records are stored.

Before issue 17 the collector kept expecting offset 500, silently skipped the 500 new
records of the restarted broker, and aiokafka logged ~930 ERROR lines in 8 s while the
broker was away. The local broker's memory storage loses everything on restart, which is
exactly this fault.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.local.broker import LocalBroker
from kvscope.schemas import Source, topic_for
from support.collector_testkit import (
    collector_config,
    envelope_records,
    kv_envelopes,
    kv_row_count,
    publish,
    until,
)


class Lines(logging.Handler):
    """Counts WARNING+ records per (logger, template) as they reach the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        """Count one record."""
        self.seen[(record.name, str(record.msg)[:50])] += 1


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def _epoch_rows(clickhouse: Any, epoch: int) -> int:
    return clickhouse.query(
        "SELECT count() FROM kv_block_events WHERE epoch = {epoch:UInt32}", {"epoch": epoch}
    ).result_rows[0][0]


def _lose_log(
    broker: LocalBroker,
    collector: Collector,
    clickhouse: Any,
    topic_prefix: str,
    before: tuple[list[tuple[bytes, bytes]], int],
    after: tuple[list[tuple[bytes, bytes]], int],
) -> None:
    """The collector stores `before` (records of epoch 1, and the rows they become); the
    broker restarts without its log and gets `after` (epoch 2); returns once the collector
    stored as many rows of epoch 2 (or fails after 60 s) and stopped.

    It waits for stored rows, not for consumed records: the restarted broker no longer
    knows the group's member, so the collector rejoins, and a rebalance drops what was
    consumed but not yet stored (the new assignment reads it again).
    """
    topic = topic_for("kv-events", topic_prefix)
    port = broker.port

    def stored(epoch: int, rows: int) -> Callable[[], bool]:
        return lambda: _epoch_rows(clickhouse, epoch) >= rows

    async def scenario() -> None:
        await publish(broker.bootstrap_servers, topic, before[0])
        task = asyncio.create_task(collector.run())
        await until(stored(1, before[1]), "the old log's rows")
        broker.stop()
        await asyncio.sleep(4.0)  # the collector keeps trying while the broker is away
        broker.port = port
        broker.start()
        await publish(broker.bootstrap_servers, topic, after[0])
        await until(stored(2, after[1]), "the new log's rows")
        collector.request_stop()
        await task

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("records", "new_records"),
    [(50, 50), (500, 500), (50, 200)],
)
def test_records_after_a_log_loss_are_stored_and_logs_stay_quiet(
    records: int,
    new_records: int,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
    lines: Lines,
) -> None:
    """The new log as long as the old one, or longer (its first records sit below the
    old stored offset: a position check alone would skip them too)."""
    migrate(clickhouse, parse_target(clickhouse_url))
    broker = LocalBroker().start()
    before = kv_envelopes(Source(instance="lost"), 1, records)
    after = kv_envelopes(Source(instance="lost"), 2, new_records, seed=1)
    config = collector_config(
        broker.bootstrap_servers, clickhouse_url, topic_prefix, exit_when_idle=None
    )
    try:
        collector = Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse)))
        _lose_log(
            broker,
            collector,
            clickhouse,
            topic_prefix,
            (envelope_records(before), kv_row_count(before)),
            (envelope_records(after), kv_row_count(after)),
        )
    finally:
        broker.stop()

    assert clickhouse.query(
        "SELECT epoch, count(), min(_offset), max(_offset) FROM kv_block_events "
        "GROUP BY epoch ORDER BY epoch"
    ).result_rows == [
        (1, kv_row_count(before), 0, records - 1),
        (2, kv_row_count(after), 0, new_records - 1),
    ]
    new_log = [n for (_, text), n in lines.seen.items() if "the log does not hold" in text]
    assert new_log == [1]
    # aiokafka's connection errors while the broker was away: each kind once per minute
    # (the throttle is process-wide, so an earlier case may already have said it)
    kafka = {key: n for key, n in lines.seen.items() if key[0].startswith("aiokafka")}
    assert all(n == 1 for n in kafka.values()), kafka


@pytest.mark.parametrize("bad_at", [1, 25, 49])
def test_a_log_lost_after_a_batch_stored_out_of_order_is_read_from_its_start(
    bad_at: int, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    """An undecodable record among the old log's records makes their batch go to two
    tables out of offset order, so it is noted (`ingest_batches`) and re-read on the next
    assignment, its stored records skipped by offset. The new log's records at those
    offsets are other records: they must be stored too, and none of the new log skipped."""
    migrate(clickhouse, parse_target(clickhouse_url))
    broker = LocalBroker().start()
    before = kv_envelopes(Source(instance="lost"), 1, 50)
    old_log = envelope_records(before)
    old_log.insert(bad_at, (b"lost/0", b"\xc1 not msgpack"))
    after = kv_envelopes(Source(instance="lost"), 2, 200, seed=1)
    config = collector_config(
        broker.bootstrap_servers, clickhouse_url, topic_prefix, exit_when_idle=None
    )
    try:
        collector = Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse)))
        _lose_log(
            broker,
            collector,
            clickhouse,
            topic_prefix,
            (old_log, kv_row_count(before)),
            (envelope_records(after), kv_row_count(after)),
        )
    finally:
        broker.stop()

    assert clickhouse.query("SELECT count() FROM ingest_batches").result_rows == [(1,)]
    assert clickhouse.query(
        "SELECT epoch, count(), min(_offset), max(_offset), uniqExact(_offset) "
        "FROM kv_block_events GROUP BY epoch ORDER BY epoch"
    ).result_rows[1:] == [(2, kv_row_count(after), 0, 199, 200)]

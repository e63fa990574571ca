"""Bad records land in ingest_errors; the healthy records around them all land."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgspec
from kvscope.collector.pipeline.columns import MAX_ERROR_VALUE
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import EngineStats, Source, encode, topic_for
from support.collector_testkit import (
    collector_config,
    envelope,
    kv_envelopes,
    kv_row_count,
    publish,
)

SOURCE = Source(instance="bad-neighbour")


def test_bad_records_go_to_ingest_errors(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    good = kv_envelopes(SOURCE, 1, 7)
    valid = encode(good[0])
    raw = msgspec.msgpack.decode(valid)
    big = os.urandom(10 * 1024 * 1024)
    bad_values: list[tuple[bytes | None, str]] = [
        (b"\xc1" + os.urandom(63), "not msgpack"),
        (valid[:-7], "truncated"),
        (msgspec.msgpack.encode({**raw, "body": {"type": "Mystery", "x": 1}}), "unknown body"),
        (msgspec.msgpack.encode({**raw, "schema": 99}), "newer schema 99"),
        (encode(envelope(SOURCE, 1, 0, 1.0, EngineStats(1, 1, 0.5))), "does not belong"),
        (None, "tombstone"),
        (msgspec.msgpack.encode({"padding": big}), "invalid envelope"),
    ]
    key = SOURCE.key.encode()
    records: list[tuple[bytes | None, bytes | None]] = []
    for env, (value, _) in zip(good, bad_values, strict=False):
        records += [(key, encode(env)), (key, value)]
    records += [(key, encode(e)) for e in good[len(bad_values) :]]

    async def scenario() -> None:
        await publish(bootstrap_servers, topic_for("kv-events", topic_prefix), records)
        config = collector_config(bootstrap_servers, clickhouse_url, topic_prefix)
        await Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse))).run()

    asyncio.run(scenario())

    assert clickhouse.query("SELECT count() FROM kv_block_events").result_rows == [
        (kv_row_count(good),)
    ]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]
    errors = clickhouse.query(
        "SELECT _offset, key, length(value), value_size, reason FROM ingest_errors ORDER BY _offset"
    ).result_rows
    assert [row[0] for row in errors] == [1, 3, 5, 7, 9, 11, 13]
    for (_, key_text, stored, size, reason), (value, why) in zip(errors, bad_values, strict=True):
        assert key_text == SOURCE.key
        assert why in reason
        assert size == len(value or b"")
        assert stored == min(size, MAX_ERROR_VALUE)
    first = clickhouse.query(
        "SELECT value FROM ingest_errors WHERE _offset = 1", column_formats={"value": "bytes"}
    ).result_rows
    assert first == [(bad_values[0][0],)]

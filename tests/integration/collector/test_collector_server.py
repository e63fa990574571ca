"""Against a real ClickHouse server: runs only when KVSCOPE_TEST_CLICKHOUSE_URL is set.

No server is installable where kvscope is developed, so this is skipped there; with a
server it checks what differs from chDB: migrations over HTTP, `insert_arrow` inserts
with deduplication in raw table and view, and the resume lookup.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.decode import _flat_kv_decoder
from kvscope.collector.pipeline.write import ClickHouseSink, Insert
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import Target, connect, parse_target
from kvscope.schemas import Source, encode
from support.collector_testkit import kv_envelopes


@pytest.fixture
def server(server_clickhouse_url: str) -> Iterator[tuple[Any, Target]]:
    """A client on a fresh database of the test server, dropped afterwards."""
    target = dataclasses.replace(
        parse_target(server_clickhouse_url), database=f"kvscope_test_{uuid.uuid4().hex[:10]}"
    )
    client = connect(target)
    yield client, target
    client.command(f"DROP DATABASE IF EXISTS {target.database}")
    client.close()


def test_server_migrations_inserts_and_resume(server: tuple[Any, Target]) -> None:
    client, target = server
    assert migrate(client, target)
    assert migrate(client, target) == []
    envelopes = [
        _flat_kv_decoder.decode(encode(e)) for e in kv_envelopes(Source(instance="srv"), 3, 10)
    ]
    rows = columns.kv_block_events(envelopes, list(range(100, 110)), "topic", 2)
    sink = ClickHouseSink(client, in_place=False)
    for _ in range(2):
        sink.insert(Insert("kv_block_events", rows, "server-token"))
    assert client.query("SELECT count() FROM kv_block_events").result_rows == [(rows.num_rows,)]
    assert client.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows == [(rows.num_rows,)]
    offsets, seqs = sink.resume_state("topic", "kv_block_events", [2])
    assert offsets == {2: 110}
    assert seqs == {2: [("srv", 0, 3, 9)]}

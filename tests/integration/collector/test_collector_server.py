"""The ClickHouse-server path: kvscope's `http://` target through clickhouse-connect's HTTP client.

Against the server in KVSCOPE_TEST_CLICKHOUSE_URL when set; otherwise (CI, this machine:
no server installs here) against `support.chdb_http.ChdbHttpFront`, ClickHouse's HTTP
interface in front of chDB. Checked: migrations over HTTP, `insert_arrow` inserts with the
deduplication token in raw table and view, the resume lookup, and two collector runs on
an `http://` target (the second resumes after what the first stored; a hole is reported
once).
docs/collector.md says what the front does not prove about a real server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.decode import _flat_kv_decoder
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ServerStore
from kvscope.collector.storage.target import Target, connect, parse_target
from kvscope.schemas import Source, encode
from support.chdb_http import ChdbHttpFront
from support.collector_testkit import (
    collector_config,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
    punch_holes,
)


@pytest.fixture
def server_url(chdb_path: Path) -> Iterator[str]:
    """KVSCOPE_TEST_CLICKHOUSE_URL, else the HTTP front over the session's chDB directory."""
    url = os.environ.get("KVSCOPE_TEST_CLICKHOUSE_URL")
    if url:
        yield url
        return
    with ChdbHttpFront(str(chdb_path)) as front:
        yield front.url


@pytest.fixture
def server(server_url: str) -> Iterator[tuple[Any, Target]]:
    """A client on a fresh database of the test server, dropped afterwards."""
    target = dataclasses.replace(
        parse_target(server_url), database=f"kvscope_test_{uuid.uuid4().hex[:10]}"
    )
    client = connect(target)
    assert type(client).__name__ == "HttpClient"
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
    sink = ClickHouseSink(ServerStore(client))
    for _ in range(2):
        sink.insert(Insert("kv_block_events", rows, "server-token"))
    # other rows, same token: dropped only if the token reached the engine (identical blocks
    # would be deduplicated by their content hash even without it)
    sink.insert(Insert("kv_block_events", rows.slice(0, 5), "server-token"))
    assert client.query("SELECT count() FROM kv_block_events").result_rows == [(rows.num_rows,)]
    assert client.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows == [(rows.num_rows,)]
    state = sink.resume_state("topic", "kv_block_events", [2])
    assert state.next_offsets == {2: 110}
    assert state.seqs == {2: [("srv", 0, 3, 9)]}


def test_collector_runs_on_an_http_target_and_resumes_exactly_once(
    server: tuple[Any, Target], bootstrap_servers: str, topic_prefix: str
) -> None:
    """`kvscope collect` against the server URL: the sink it opens itself is the HTTP client
    (`insert_arrow`, migrations at start); a second run resumes after the stored prefix."""
    client, target = server
    envelopes, gap_rows = punch_holes(kv_envelopes(Source(instance="srv"), 4, 60), [(20, 22, True)])
    expected = kv_row_count(envelopes)

    async def run(batch: list) -> None:
        await publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", batch)
        config = collector_config(bootstrap_servers, "chdb:///unused", topic_prefix, target=target)
        await Collector(config).run()

    asyncio.run(run(envelopes[:30]))
    asyncio.run(run(envelopes[30:]))
    total, distinct = client.query(
        "SELECT count(), uniqExact(seq, event_index, position) FROM kv_block_events"
    ).result_rows[0]
    assert (total, distinct) == (expected, expected)
    gaps = client.query(
        "SELECT instance, detected_by, first_seq, last_seq, seq FROM stream_gaps"
    ).result_rows
    assert sorted(gaps) == sorted(gap_rows)

"""The collector in cluster mode, on chDB standing in for one node of a cluster.

chDB is a single embedded server: it can host neither Replicated*MergeTree (no Keeper)
nor Distributed tables (no remote_servers). The stand-in is `kvscope migrate --cluster
--print`'s own DDL with exactly those two swapped for what one node can run: the
shard-local tables keep their `_local` names with the non-replicated engine, and each
Distributed table becomes a Merge table over its local table under the plain name (which
cannot be written to: a backfill `INSERT` writes the local table instead). So
this checks what kvscope does in cluster mode (which tables it inserts into, that resume
positions are read back through the plain names, the cluster insert and read settings
are accepted, exactly once across a restart), not replication or sharding themselves:
those need a real cluster (tests/integration/collector/test_cluster_server.py).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage import tables
from kvscope.collector.storage.cluster import local_name
from kvscope.collector.storage.migrate import load_migrations, migrate, planned_statements
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import Source
from support.collector_testkit import (
    collector_config,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
)

CLUSTER = "kvscope_cluster"


def _single_node(statement: str) -> str:
    """A cluster DDL statement as one chDB node can run it (see the module doc)."""
    statement = statement.replace(f" ON CLUSTER {CLUSTER}", "")
    statement = re.sub(
        r"^INSERT INTO (\w+)", lambda m: f"INSERT INTO {local_name(m[1])}", statement
    )
    # engine arguments after the Keeper path and replica stay (ReplacingMergeTree's version)
    statement = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '[^']*'(, )?", r"\1(", statement)
    statement = re.sub(
        r"\breplicated_deduplication_window", "non_replicated_deduplication_window", statement
    )
    return re.sub(
        r"ENGINE = Distributed\(\w+, currentDatabase\(\), (\w+), .*",
        r"ENGINE = Merge(currentDatabase(), '^\1$')",
        statement,
        flags=re.DOTALL,
    )


@pytest.fixture
def node(clickhouse: Any, clickhouse_url: str) -> Any:
    """The test database laid out like one node of a migrated cluster."""
    for statement in planned_statements(CLUSTER):
        clickhouse.command(_single_node(statement))
    clickhouse.insert(
        tables.MIGRATIONS,
        [[m.version, m.name, m.checksum] for m in load_migrations()],
        column_names=["version", "name", "checksum"],
    )
    assert migrate(clickhouse, parse_target(clickhouse_url), CLUSTER) == []
    return clickhouse


def _count(client: Any, table: str) -> int:
    return int(client.query(f"SELECT count() FROM {table}").result_rows[0][0])


def _run(node: Any, bootstrap: str, url: str, prefix: str, group: str) -> None:
    config = collector_config(bootstrap, url, prefix, group=group, cluster=CLUSTER)
    collector = Collector(config, sink=ClickHouseSink(ChdbStore(node, CLUSTER)))
    asyncio.run(collector.run())


@pytest.mark.parametrize("records", [40, 300])
def test_cluster_mode_writes_local_tables_and_resumes_exactly_once(
    node: Any, bootstrap_servers: str, clickhouse_url: str, topic_prefix: str, records: int
) -> None:
    sources = [Source(instance=f"engine-{i}", model="m") for i in range(2)]
    first = [e for i, s in enumerate(sources) for e in kv_envelopes(s, 7, records, seed=i)]
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", first))
    _run(node, bootstrap_servers, clickhouse_url, topic_prefix, f"a-{topic_prefix}")
    events = tables.KV_BLOCK_EVENTS.name
    assert _count(node, local_name(events)) == kv_row_count(first)
    assert _count(node, events) == kv_row_count(first)  # read through the plain name
    aggregate = local_name(tables.KV_BLOCK_EVENTS_1M.name)
    stores = node.query(f"SELECT sum(stores) FROM {aggregate}").result_rows[0][0]
    stored = _count(node, f"{local_name(events)} WHERE event = 'stored'")
    assert stores == stored > 0  # the view fed the local aggregate table from the local one

    # A new consumer group has no committed offsets: only the positions stored in
    # ClickHouse, read through the plain names, keep the old records from coming back.
    more = [
        e
        for i, s in enumerate(sources)
        for e in kv_envelopes(s, 7, records // 2, seed=10 + i, start_seq=records)
    ]
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", more))
    _run(node, bootstrap_servers, clickhouse_url, topic_prefix, f"b-{topic_prefix}")
    assert _count(node, local_name(events)) == kv_row_count(first) + kv_row_count(more)
    churn = {r["instance"]: r for r in run_query(node, "eviction_churn", {"until": "2100-01-01"})}
    assert set(churn) == {s.instance for s in sources}
    assert all(row["stores"] > 0 for row in churn.values())
    for row in run_query(node, "completeness", {"until": "2100-01-01"}):
        assert row["completeness"] == 1.0 and row["undeclared_missing"] == 0, row

"""Cluster mode against a real ClickHouse cluster: runs only when one is configured.

Set KVSCOPE_TEST_CLICKHOUSE_CLUSTER_URL (a node's http(s) URL, with a database the user
may create tables in) and KVSCOPE_TEST_CLICKHOUSE_CLUSTER (its remote_servers name, with
`{shard}`/`{replica}` macros defined on every node). Not run where kvscope is developed:
no cluster is available there (docs/operations.md says so).
"""

from __future__ import annotations

import os

import pytest
from kvscope.analytics.queries import run_query
from kvscope.collector.storage import tables
from kvscope.collector.storage.cluster import local_name
from kvscope.collector.storage.migrate import run_migrations
from kvscope.collector.storage.target import connect, parse_target


@pytest.fixture(scope="module")
def cluster_target() -> tuple[object, str]:
    """The configured cluster node's target and the cluster name; skips when unset."""
    url = os.environ.get("KVSCOPE_TEST_CLICKHOUSE_CLUSTER_URL")
    name = os.environ.get("KVSCOPE_TEST_CLICKHOUSE_CLUSTER")
    if not url or not name:
        pytest.skip("KVSCOPE_TEST_CLICKHOUSE_CLUSTER_URL/_CLUSTER not set (no cluster here)")
    return parse_target(url), name


def test_cluster_migration_is_idempotent_and_queries_run(cluster_target: tuple) -> None:
    target, name = cluster_target
    run_migrations(target, raw_ttl_days=7, cluster=name)
    assert run_migrations(target, cluster=name) == []
    client = connect(target)
    try:
        engines = dict(
            client.query(
                "SELECT name, engine FROM system.tables WHERE database = currentDatabase()"
            ).result_rows
        )
        for table in tables.RAW + tables.AGGREGATES:
            assert engines[table.name] == "Distributed", table.name
            assert engines[local_name(table.name)].startswith("Replicated"), table.name
        for query in ("eviction_churn", "completeness", "transfer_latency"):
            run_query(client, query, {"until": "2100-01-01T00:00:00"})
    finally:
        client.close()

"""The store picks its backend from the target URL (and the cluster name); callers ask it
what differs. A recording client stands in for clickhouse-connect: no ClickHouse here."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from kvscope.collector.storage.store import (
    CLUSTER_INSERT_SETTINGS,
    CLUSTER_READ_SETTINGS,
    ChdbStore,
    ClusterStore,
    ServerStore,
    store_for,
)
from kvscope.collector.storage.target import parse_target
from kvscope.schemas.errors import ConfigError


class RecordingClient:
    database = "kvscope"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("command", cmd, kwargs))

    def insert_arrow(self, table: str, rows: pa.Table, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("insert_arrow", table, kwargs["settings"]))

    def close(self) -> None:
        self.calls.append(("close", None, None))


@pytest.mark.parametrize(
    ("url", "cluster", "backend", "embedded", "journaled", "table"),
    [
        ("chdb:///var/lib/kv", None, ChdbStore, True, True, "t"),
        ("chdb:///var/lib/kv", "c1", ChdbStore, True, False, "t_local"),
        ("http://ch:8123/db", None, ServerStore, False, True, "t"),
        ("https://u:p@ch/db", None, ServerStore, False, True, "t"),
        ("http://ch:8123/db", "c1", ClusterStore, False, False, "t_local"),
    ],
)
def test_the_target_picks_the_backend(
    url: str, cluster: str | None, backend: type, embedded: bool, journaled: bool, table: str
) -> None:
    store = store_for(parse_target(url), RecordingClient(), cluster)  # type: ignore[arg-type]
    assert type(store) is backend
    assert (store.embedded, store.cluster, store.journaled) == (embedded, cluster, journaled)
    assert store.insert_table("t") == table
    assert store.read_settings() == (None if cluster is None else CLUSTER_READ_SETTINGS)


def test_a_cluster_name_must_be_an_identifier() -> None:
    with pytest.raises(ConfigError):
        ClusterStore(RecordingClient(), "c1; DROP")  # type: ignore[arg-type]


@pytest.mark.parametrize("cluster", [None, "c1"])
def test_inserts_take_the_backend_path_and_settings(cluster: str | None) -> None:
    rows = pa.table({"a": pa.array([1, 2], pa.uint32())})
    server_client, chdb_client = RecordingClient(), RecordingClient()
    settings = {"insert_deduplication_token": "tok"}
    server = ServerStore(server_client, cluster)  # type: ignore[arg-type]
    server.insert("t", rows, settings)
    [(kind, table, sent)] = server_client.calls
    extra = {} if cluster is None else CLUSTER_INSERT_SETTINGS
    assert (kind, table, sent) == ("insert_arrow", "t", {**settings, **extra})
    ChdbStore(chdb_client, cluster).insert("t", rows, settings)  # type: ignore[arg-type]
    [(kind, sql, _)] = chdb_client.calls
    assert kind == "command"
    assert sql.startswith("INSERT INTO t (`a`) SELECT `a` FROM Python(rows) SETTINGS ")
    assert "insert_deduplication_token = 'tok'" in sql
    assert "exclude_materialize_skip_indexes_on_insert = 'block_hash_bf'" in sql
    assert ("insert_quorum = 'auto'" in sql) == (cluster is not None)
    assert settings == {"insert_deduplication_token": "tok"}  # the caller's dict is not changed

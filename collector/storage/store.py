"""The storage backend behind one small contract: embedded chDB, a server, or a cluster.

`open_store(target, cluster)` connects and picks the backend from the target URL (and the
`--cluster` name), as clickhouse-connect's `create_client` picks its chDB or HTTP client
from the DSN. Callers ask the store what differs instead of checking the client's type:

- `ChdbStore` (`chdb://`): `embedded`; inserts read the Arrow table in place
  (`INSERT ... SELECT FROM Python(rows)`);
- `ServerStore` (`http(s)://`): inserts through clickhouse-connect's `insert_arrow`;
- `ClusterStore` (`http(s)://` and `--cluster NAME`): `cluster` set; inserts go to the
  shard-local `<table>_local` with a quorum, resume reads ask for sequential consistency,
  and flushes are not `journaled`.

Queries stay plain client calls (`store.client`); only what differs lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa
from kvscope.collector.storage.client import Client
from kvscope.collector.storage.cluster import check_cluster_name, local_name
from kvscope.collector.storage.target import Target, connect

DEFERRED_INDEX_SETTINGS = {"exclude_materialize_skip_indexes_on_insert": "block_hash_bf"}
"""Settings of in-place (chDB) inserts: `kv_block_events`' bloom filter on `block_hash` is
built when the part is merged, not on insert (measured: ~50 ns of CPU per row).

Every merge computes its part's skip indexes from the merged rows, so an index built on
insert is thrown away at the part's first merge; background merges soon fold the freshly
inserted parts together. Until then a lookup by `block_hash` reads those newest parts
whole: same answer, a little more reading. chDB only: the setting is recent (a server
that does not know it would refuse the insert)."""
CLUSTER_INSERT_SETTINGS = {"insert_quorum": "auto", "insert_quorum_parallel": 0}
"""Cluster mode: an insert is acknowledged once a majority of the shard's replicas have it,
in order, so a resume read with sequential consistency cannot miss it (a retry with the
same token is still dropped by the replicated deduplication window)."""
CLUSTER_READ_SETTINGS = {"select_sequential_consistency": 1}
"""Cluster mode: resume positions are read (through the Distributed tables, from every
shard) only from replicas that have every quorum insert; a lagging one fails the read,
which the collector retries, instead of returning an older position."""


class Store:
    """kvscope's tables on one backend: the client, and what differs between backends."""

    embedded: ClassVar[bool] = False
    """chDB in this process (one data directory per process, inserts read Arrow in place)."""

    def __init__(self, client: Client, cluster: str | None = None) -> None:
        self.client = client
        """The clickhouse-connect client (queries go straight to it)."""
        self.cluster = None if cluster is None else check_cluster_name(cluster)
        """Cluster mode: the `remote_servers` name the tables were migrated for; None else.
        Inserts go to the shard-local tables with a quorum, resume reads ask for
        sequential consistency."""

    @property
    def journaled(self) -> bool:
        """Flushes feeding views are journaled and repeated on assignment (not in cluster
        mode: another collector's repeat could land on another shard)."""
        return self.cluster is None

    def insert_table(self, table: str) -> str:
        """The table an insert into `table` goes to (its shard-local one in cluster mode)."""
        return table if self.cluster is None else local_name(table)

    def read_settings(self) -> dict[str, Any] | None:
        """Settings of the reads that decide where a partition resumes."""
        return None if self.cluster is None else CLUSTER_READ_SETTINGS

    def insert(self, table: str, rows: pa.Table, settings: Mapping[str, Any]) -> None:
        """Insert `rows` into `table` (as named by `insert_table`) with `settings`."""
        settings = dict(settings)
        if self.cluster is not None:
            settings.update(CLUSTER_INSERT_SETTINGS)
        self._send(table, rows, settings)

    def _send(self, table: str, rows: pa.Table, settings: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the client."""
        self.client.close()


class ServerStore(Store):
    """A ClickHouse server (`http://`, `https://`): inserts go as Arrow through
    clickhouse-connect's `insert_arrow` (the only way for a server; a chDB client takes
    them too)."""

    def _send(self, table: str, rows: pa.Table, settings: dict[str, Any]) -> None:
        self.client.insert_arrow(table, rows, settings=settings)


class ClusterStore(ServerStore):
    """Servers in cluster mode (`http(s)://` and `--cluster NAME`)."""

    def __init__(self, client: Client, cluster: str) -> None:
        super().__init__(client, cluster)


class ChdbStore(Store):
    """Embedded chDB (`chdb://`): inserts read the Arrow table in place (`Python(rows)`),
    no IPC file; skip indexes are left to the merge. With a cluster name it stands in for
    one node of a cluster (tests)."""

    embedded: ClassVar[bool] = True

    def _send(self, table: str, rows: pa.Table, settings: dict[str, Any]) -> None:
        """`INSERT ... SELECT FROM Python(rows)`: chDB reads the local Arrow table `rows`.

        Table and column names come from our own schema; setting values are ints and
        a hex token, so inlining them is safe.
        """
        settings.update(DEFERRED_INDEX_SETTINGS)
        names = ", ".join(f"`{name}`" for name in rows.column_names)
        values = ", ".join(f"{key} = '{value}'" for key, value in settings.items())
        rows = _without_null_flags(rows)
        self.client.command(
            f"INSERT INTO {table} ({names}) SELECT {names} FROM Python(rows) SETTINGS {values}"
        )


def _without_null_flags(rows: pa.Table) -> pa.Table:
    """`rows` with every column that holds no null marked non-nullable (no data copied).

    chDB's `Python(table)` reads a nullable Arrow field as `Nullable(T)`, and the insert
    then converts every such column to the table's plain `T`, row by row; a non-nullable
    field is read as `T` directly (measured: ~25 ns less CPU per kv_block_events row).
    """
    fields = [f.with_nullable(rows.column(i).null_count > 0) for i, f in enumerate(rows.schema)]
    schema = pa.schema(fields, metadata=rows.schema.metadata)
    return rows if schema == rows.schema else rows.cast(schema)


def store_for(target: Target, client: Client, cluster: str | None = None) -> Store:
    """The store of `client`, connected to `target`: the backend the URL (and `cluster`)
    names."""
    if target.is_chdb:
        return ChdbStore(client, cluster)
    if cluster is not None:
        return ClusterStore(client, cluster)
    return ServerStore(client)


def open_store(target: Target, cluster: str | None = None, create_database: bool = True) -> Store:
    """Connect to `target` (see `connect`) and wrap the client in its backend's store."""
    return store_for(target, connect(target, create_database), cluster)

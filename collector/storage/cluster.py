"""ClickHouse cluster mode: kvscope's migrations rewritten for sharded, replicated servers.

The single-server statements in `sql/migrations` stay the one source of the schema;
`cluster_statements` rewrites each for a cluster named in `remote_servers`:

- a table becomes a shard-local `<name>_local`, created `ON CLUSTER`, with the Replicated
  variant of its engine (ZooKeeper path from the `{shard}`, `{database}` and `{table}`
  macros, replica name from `{replica}`) and everything else as written: columns, types,
  codecs, indexes, projections, partitioning, ordering; the non-replicated deduplication
  window becomes the replicated one (same size), so a retried insert with the same
  deduplication token is still dropped;
- next to it a `Distributed` table with the plain name reads every shard, so queries,
  the report and the dashboards run unchanged (sharding key: the source, where the table
  has one, so one source's rows stay on one shard when inserted through it);
- a materialized view is created on every node between the local tables;
- an `ALTER TABLE` (e.g. codecs) or `TRUNCATE TABLE` applies to the local tables, on
  every node; an `ADD COLUMN` also to the Distributed tables, whose columns must follow;
- an `INSERT INTO ... SELECT` (a backfill) runs once, through the Distributed tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvscope.schemas.errors import ConfigError

LOCAL_SUFFIX = "_local"
"""Suffix of the shard-local replicated table behind each Distributed table."""
ZOOKEEPER_PATH = "/clickhouse/tables/{shard}/{database}/{table}"
"""Replication path: one per shard and table; the replicas of a shard share it."""
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\b")
_ENGINE = re.compile(r"\bENGINE = (\w*MergeTree)\b(?:\(([^)]*)\))?")
_ON_LOCAL_TABLE = re.compile(r"^(ALTER|TRUNCATE) TABLE (\w+)\b")
_ADD_COLUMN = re.compile(r"\bADD COLUMN\b")
_INSERT = re.compile(r"^INSERT INTO \w+\b")
_VIEW = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\b")
_FROM = re.compile(r"\bFROM (\w+)\b")
_COLUMN = re.compile(r"^\s+(\w+) ", flags=re.MULTILINE)
_SHARDING_KEYS = (
    (("instance", "dp_rank"), "cityHash64(instance, dp_rank)"),
    (("src_instance", "dst_instance"), "cityHash64(src_instance, dst_instance)"),
    (("_topic", "_partition"), "cityHash64(_topic, _partition)"),
)
"""Sharding key by the columns a table has, first match wins (else rand())."""


def check_cluster_name(cluster: str) -> str:
    """`cluster` if it is a plain identifier (it is spliced into DDL), else ConfigError."""
    if not _IDENTIFIER.match(cluster):
        raise ConfigError(
            f"cluster name {cluster!r} is not a plain identifier (letters, digits, _); "
            "use the name of a remote_servers entry"
        )
    return cluster


def local_name(table: str) -> str:
    """The shard-local table behind the Distributed table `table`."""
    return f"{table}{LOCAL_SUFFIX}"


def replicated(statement: str, cluster: str, *, suffix: str = LOCAL_SUFFIX) -> str:
    """A `CREATE TABLE` made replicated and `ON CLUSTER`, its name suffixed with `suffix`."""
    header = _CREATE_TABLE.match(statement)
    engine = _ENGINE.search(statement)
    if header is None or engine is None:
        raise ConfigError(f"not a MergeTree-family CREATE TABLE: {statement[:60]!r}")
    args = ", ".join(a for a in (f"'{ZOOKEEPER_PATH}'", "'{replica}'", engine.group(2)) if a)
    return (
        f"CREATE TABLE IF NOT EXISTS {header.group(1)}{suffix} ON CLUSTER {cluster}"
        + statement[header.end() : engine.start()]
        + f"ENGINE = Replicated{engine.group(1)}({args})"
        + statement[engine.end() :].replace(
            "non_replicated_deduplication_window", "replicated_deduplication_window"
        )
    )


def distributed(statement: str, cluster: str) -> str:
    """The Distributed table over the local table of a `CREATE TABLE` statement."""
    header = _CREATE_TABLE.match(statement)
    if header is None:
        raise ConfigError(f"not a CREATE TABLE: {statement[:60]!r}")
    name = header.group(1)
    columns = set(_COLUMN.findall(statement))
    key = next((k for cols, k in _SHARDING_KEYS if columns.issuperset(cols)), "rand()")
    return (
        f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER {cluster} AS {local_name(name)}\n"
        f"ENGINE = Distributed({cluster}, currentDatabase(), {local_name(name)}, {key})"
    )


def view(statement: str, cluster: str) -> str:
    """A materialized view between the local tables, created on every node."""
    match = _VIEW.match(statement)
    if match is None:
        raise ConfigError(f"not a CREATE MATERIALIZED VIEW ... TO: {statement[:60]!r}")
    body = _FROM.sub(lambda m: f"FROM {local_name(m.group(1))}", statement[match.end() :], 1)
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {match.group(1)} ON CLUSTER {cluster} "
        f"TO {local_name(match.group(2))} AS{body}"
    )


def cluster_statements(statements: Iterable[str], cluster: str) -> tuple[str, ...]:
    """The cluster form of single-server migration statements (see the module doc)."""
    check_cluster_name(cluster)
    out: list[str] = []
    for statement in statements:
        if _VIEW.match(statement):
            out.append(view(statement, cluster))
        elif _INSERT.match(statement):
            out.append(statement)
        elif on_local := _ON_LOCAL_TABLE.match(statement):
            verb, table = on_local.groups()
            rest = statement[on_local.end() :]
            out.append(f"{verb} TABLE {local_name(table)} ON CLUSTER {cluster}" + rest)
            if _ADD_COLUMN.search(rest):
                out.append(f"{verb} TABLE {table} ON CLUSTER {cluster}" + rest)
        else:
            out += [replicated(statement, cluster), distributed(statement, cluster)]
    return tuple(out)

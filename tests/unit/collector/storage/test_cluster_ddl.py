"""Cluster DDL (`kvscope migrate --cluster NAME --print`): golden, parsed by ClickHouse's own
parser (chDB's formatQuery), checked for a 2-shard x 2-replica layout; the single-server
DDL is unchanged."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from kvscope.cli.main import main
from kvscope.collector.storage import cluster
from kvscope.collector.storage.migrate import load_migrations, planned_statements
from kvscope.schemas.errors import ConfigError

GOLDEN = Path(__file__).resolve().parents[3] / "data" / "cluster_ddl.sql"
CLUSTER = "kvscope_cluster"
SHARDS, REPLICAS = 2, 2


def _printed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["migrate", "--print", *args]) == 0
    return capsys.readouterr().out


def _statements(text: str) -> list[str]:
    return [s.strip() for s in re.split(r";\n\n", text) if s.strip()]


def _formatted(client: Any, statement: str) -> str:
    """ClickHouse's own rendering of `statement` (raises on a syntax error)."""
    return client.query("SELECT formatQuery({q:String})", parameters={"q": statement}).result_rows[
        0
    ][0]


def test_cluster_ddl_is_the_golden_file(capsys: pytest.CaptureFixture[str]) -> None:
    printed = _printed(capsys, "--cluster", CLUSTER)
    assert printed == GOLDEN.read_text(), (
        "cluster DDL changed; if intended: "
        f"kvscope migrate --print --cluster {CLUSTER} > tests/data/cluster_ddl.sql"
    )


def test_single_server_ddl_is_the_migration_files_unchanged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printed = _statements(_printed(capsys))
    files = [s for m in load_migrations() for s in m.statements]
    assert printed[1:] == files
    assert "ON CLUSTER" not in "".join(printed) and "Replicated" not in "".join(printed)
    assert printed == planned_statements(None)


def test_every_statement_parses(clickhouse: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for args in ((), ("--cluster", CLUSTER)):
        statements = _statements(_printed(capsys, *args))
        assert statements
        for statement in statements:
            _formatted(clickhouse, statement)
    with pytest.raises(Exception, match=r"(?i)syntax"):
        _formatted(clickhouse, "CREATE TABLE t ON CLUSTER (x UInt8)")


def _column_section(formatted: str) -> str:
    """The part of a formatted CREATE TABLE between the name and ENGINE."""
    return formatted.split("\n", 1)[1].split("ENGINE =")[0]


def _tail(formatted: str) -> str:
    """PARTITION BY / ORDER BY / TTL / SETTINGS, with the replicated window renamed back."""
    tail = formatted.split("ENGINE =", 1)[1].split("\n", 1)[1]
    return re.sub(r"\breplicated_deduplication_window", "non_replicated_deduplication_window", tail)


def test_local_tables_keep_columns_projections_indexes_and_keys(clickhouse: Any) -> None:
    single = [s for m in load_migrations() for s in m.statements]
    clustered = cluster.cluster_statements(single, CLUSTER)
    tables = [s for s in single if s.startswith("CREATE TABLE")]
    views = [s for s in single if s.startswith("CREATE MATERIALIZED VIEW")]
    on_local = [s for s in single if re.match(r"(ALTER|TRUNCATE) TABLE ", s)]
    assert any(s.startswith("TRUNCATE") for s in on_local)
    inserts = [s for s in single if s.startswith("INSERT INTO ")]
    assert inserts and set(inserts) <= set(clustered), "a backfill runs as written"
    add_columns = [s for s in on_local if " ADD COLUMN " in s]
    assert add_columns, "a migration adds a column"
    assert len(clustered) == (
        2 * len(tables) + len(views) + len(on_local) + len(add_columns) + len(inserts)
    )
    for statement in on_local:
        verb, name, rest = re.match(r"(ALTER|TRUNCATE) TABLE (\w+)(.*)", statement, re.S).groups()
        assert f"{verb} TABLE {name}_local ON CLUSTER {CLUSTER}{rest}" in clustered, name
        on_distributed = f"{verb} TABLE {name} ON CLUSTER {CLUSTER}{rest}" in clustered
        assert on_distributed == (statement in add_columns), "its columns follow the local's"
    by_header = {s.split("\n", 1)[0]: s for s in clustered}
    for statement in tables:
        name = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement).group(1)
        local = next(s for h, s in by_header.items() if f" {name}_local ON CLUSTER " in h)
        original, replicated = _formatted(clickhouse, statement), _formatted(clickhouse, local)
        assert _column_section(replicated) == _column_section(original), name
        assert _tail(replicated) == _tail(original), name
        assert re.search(r"ENGINE = Replicated\w*MergeTree\('", replicated), name
        dist = by_header[f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER {CLUSTER} AS {name}_local"]
        assert f"Distributed({CLUSTER}, currentDatabase(), {name}_local, " in dist
    for statement in views:
        name = re.match(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)", statement).group(1)
        clustered_view = next(s for s in clustered if f"VIEW IF NOT EXISTS {name} ON CLUSTER" in s)
        assert re.search(r"\bTO \w+_local AS\b", clustered_view)
        assert re.search(r"\bFROM \w+_local\b", clustered_view)
        strip = lambda s: re.sub(r"_local\b| ON CLUSTER \w+", "", _formatted(clickhouse, s))  # noqa: E731
        assert strip(clustered_view) == _formatted(clickhouse, statement)


def test_two_shards_two_replicas_share_paths_within_a_shard_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    statements = _statements(_printed(capsys, "--cluster", CLUSTER))
    replicated = [s for s in statements if "ENGINE = Replicated" in s]
    ddl = [s for s in statements if not s.startswith("INSERT INTO ")]
    assert replicated and all(f"ON CLUSTER {CLUSTER}" in s for s in ddl)
    for statement in replicated:
        table = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", statement).group(1)
        engine = re.search(r"Replicated\w*MergeTree\('([^']+)', '([^']+)'", statement)
        path, replica = engine.groups()
        nodes = {
            (shard, rep): (
                path.format(shard=f"0{shard}", database="kvscope", table=table),
                replica.format(replica=f"node-{shard}-{rep}"),
            )
            for shard in range(1, SHARDS + 1)
            for rep in range(1, REPLICAS + 1)
        }
        for shard in range(1, SHARDS + 1):
            paths = {nodes[(shard, r)][0] for r in range(1, REPLICAS + 1)}
            names = {nodes[(shard, r)][1] for r in range(1, REPLICAS + 1)}
            assert len(paths) == 1 and len(names) == REPLICAS, table
        assert len({p for p, _ in nodes.values()}) == SHARDS, table


@pytest.mark.parametrize("name", ["", "a-b", "x; DROP TABLE t", "{cluster}", "1abc"])
def test_cluster_name_must_be_an_identifier(name: str) -> None:
    table = "CREATE TABLE IF NOT EXISTS t (x UInt8) ENGINE = MergeTree ORDER BY x"
    with pytest.raises(ConfigError, match="identifier"):
        cluster.cluster_statements([table], name)


def test_bad_cluster_name_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--print", "--cluster", "bad name"]) == 2  # bad input
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "identifier" in err and "Traceback" not in err

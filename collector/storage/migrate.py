"""Schema migrations: apply `sql/migrations/NNN_name.sql` in order, once each.

Applied versions are recorded in `kvscope_migrations` (version, name, checksum). Every
statement is idempotent (`IF NOT EXISTS`), so two processes migrating at once cannot
break anything: for an embedded chDB target they also serialize on a lock file in the
data directory; for a server, the worst case is both applying the same idempotent
statements and recording the same version twice (the table is a ReplacingMergeTree and
is read with DISTINCT). An applied migration whose file changed is refused.

Retention is not in the SQL files: `apply_ttl()` sets (or removes) a table TTL in days.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.resources
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from kvscope.collector.storage.client import Client
from kvscope.collector.storage.cluster import (
    check_cluster_name,
    cluster_statements,
    local_name,
    replicated,
)
from kvscope.collector.storage.tables import AGGREGATES, MIGRATIONS, RAW, Table
from kvscope.collector.storage.target import Target, connect
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclasses.dataclass(frozen=True)
class Migration:
    """One migration file: its version, name, statements and checksum."""

    version: int
    name: str
    statements: tuple[str, ...]
    checksum: str


def split_statements(sql: str) -> tuple[str, ...]:
    """Split a migration file on `;` at line ends, dropping `--` comment lines."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    parts = re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE)
    return tuple(part.strip() for part in parts if part.strip())


def load_migrations() -> list[Migration]:
    """All migrations shipped in `kvscope.sql/migrations`, ordered by version."""
    folder = importlib.resources.files("kvscope.sql").joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if not match:
            continue
        text = entry.read_text(encoding="utf-8")
        found.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                statements=split_statements(text),
                checksum=hashlib.sha256(text.encode()).hexdigest(),
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"duplicate migration versions: {versions}")
    return found


@contextlib.contextmanager
def _migration_lock(target: Target) -> Iterator[None]:
    """An exclusive lock on the chDB directory; servers rely on idempotent statements."""
    if not target.is_chdb:
        yield
        return
    lock_path = Path(target.path) / ".kvscope-migrate.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _migrations_table_ddl(cluster: str | None) -> str:
    ddl = (
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS}\n(version UInt32, name String, "
        "checksum String, applied_at DateTime64(3) DEFAULT now64(3))\n"
        "ENGINE = ReplacingMergeTree ORDER BY version"
    )
    return ddl if cluster is None else replicated(ddl, cluster, suffix="")


def _statements(migration: Migration, cluster: str | None) -> tuple[str, ...]:
    if cluster is None:
        return migration.statements
    return cluster_statements(migration.statements, cluster)


def planned_statements(cluster: str | None = None) -> list[str]:
    """Every statement a migration from scratch runs, in order (`kvscope migrate --print`).

    With `cluster`, their cluster form (`kvscope.collector.storage.cluster`).
    """
    if cluster is not None:
        check_cluster_name(cluster)
    statements = [_migrations_table_ddl(cluster)]
    for migration in load_migrations():
        statements += _statements(migration, cluster)
    return statements


def _applied(client: Client, cluster: str | None) -> dict[int, str]:
    # EXISTS first: a collector whose user may not CREATE still starts on a current schema.
    if not int(client.command(f"EXISTS TABLE {MIGRATIONS}")):
        client.command(_migrations_table_ddl(cluster))
    rows = client.query(f"SELECT DISTINCT version, checksum FROM {MIGRATIONS}").result_rows
    return {int(version): str(checksum) for version, checksum in rows}


def migrate(client: Client, target: Target, cluster: str | None = None) -> list[int]:
    """Apply every pending migration on `client` (bound to `target`); return those applied.

    With `cluster`, in cluster form (`ON CLUSTER`, replicated local tables, Distributed).
    """
    newly: list[int] = []
    with _migration_lock(target):
        applied = _applied(client, cluster)
        for migration in load_migrations():
            known = applied.get(migration.version)
            if known is not None:
                if known != migration.checksum:
                    raise ConfigError(
                        f"migration {migration.version:03d}_{migration.name} changed after it "
                        "was applied; add a new migration instead of editing an old one"
                    )
                continue
            log.info("applying migration %03d_%s", migration.version, migration.name)
            for statement in _statements(migration, cluster):
                client.command(statement)
            client.insert(
                MIGRATIONS,
                [[migration.version, migration.name, migration.checksum]],
                column_names=["version", "name", "checksum"],
            )
            newly.append(migration.version)
    if not newly:
        log.info("schema of %s is up to date", target.safe_url)
    return newly


def _has_ttl(client: Client, table: str) -> bool:
    query = client.query(
        "SELECT create_table_query FROM system.tables WHERE database = {db:String} "
        "AND name = {table:String}",
        parameters={"db": client.database, "table": table},
    ).result_rows
    return bool(query) and " TTL " in str(query[0][0])


MAX_TTL_DAYS = 10_000
"""The longest TTL (27 years; 0 keeps rows forever). ClickHouse adds the days to a DateTime,
which ends in 2106 and wraps around past it: 30,000 days after a 2026 row is 1972, so every
row would expire and be deleted at its next merge."""


def check_ttl_days(days: int, what: str = "TTL days") -> None:
    """Raise `ConfigError` unless `days` is 0 (forever) to `MAX_TTL_DAYS`."""
    if not 0 <= days <= MAX_TTL_DAYS:
        raise ConfigError(
            f"{what} must be 0 to {MAX_TTL_DAYS:,} (0 keeps rows forever; a longer TTL "
            f"would pass ClickHouse's last DateTime, 2106, and delete every row), got {days}"
        )


def apply_ttl(
    client: Client, tables: Iterable[Table], days: int | None, cluster: str | None = None
) -> None:
    """Set a TTL of `days` on `tables` (0 removes it, None leaves it as it is).

    With `cluster`, on the shard-local tables of every node.
    """
    if days is None:
        return
    check_ttl_days(days)
    names = []
    for table in tables:
        name = table.name if cluster is None else local_name(table.name)
        where = name if cluster is None else f"{name} ON CLUSTER {cluster}"
        names.append(name)
        if days == 0:
            if _has_ttl(client, name):
                client.command(f"ALTER TABLE {where} REMOVE TTL")
        else:
            client.command(
                f"ALTER TABLE {where} MODIFY TTL {table.ttl_time} + INTERVAL {int(days)} DAY "
                "SETTINGS materialize_ttl_after_modify = 0"
            )
    log.info("TTL of %s set to %s days (0 = keep forever)", ", ".join(names), days)


def run_migrations(
    target: Target,
    raw_ttl_days: int | None = None,
    aggregate_ttl_days: int | None = None,
    cluster: str | None = None,
) -> list[int]:
    """Connect, migrate, and apply the requested retention; the `kvscope migrate` core."""
    if cluster is not None:
        check_cluster_name(cluster)
    client = connect(target)
    try:
        applied = migrate(client, target, cluster)
        apply_ttl(client, RAW, raw_ttl_days, cluster)
        apply_ttl(client, AGGREGATES, aggregate_ttl_days, cluster)
        return applied
    finally:
        client.close()

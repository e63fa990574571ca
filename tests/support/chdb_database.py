"""A fresh database in the session's chDB directory, for a test or a whole module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def fresh_database(chdb_path: Path, database: str) -> Iterator[Any]:
    """A clickhouse-connect client on `chdb_path` using `database`, created for the block
    and dropped after it."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}")
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.database = database
    try:
        yield client
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")
        client.close()

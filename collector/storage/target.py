"""The ClickHouse target: one URL parsed into a frozen `Target`, and `connect()`.

Accepted URLs:
- `http://user:pass@host:8123/db`, `https://...` — a ClickHouse server (default port
  8123 / 8443, default database `kvscope`);
- `chdb:///abs/path` or `chdb://relative/path`, with optional `?database=NAME` — embedded
  chDB (the ClickHouse engine in this process) storing its data in that directory.

Without a URL kvscope uses `$KVSCOPE_CLICKHOUSE_URL`, else embedded chDB in
`$XDG_DATA_HOME/kvscope/chdb` (`~/.local/share/kvscope/chdb`). Passwords never appear
in `repr()`/`str()` or logs: use `Target.safe_url`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kvscope.collector.errors import SinkError
from kvscope.collector.storage.client import Client
from kvscope.schemas.errors import ConfigError

DEFAULT_DATABASE = "kvscope"
ENV_URL = "KVSCOPE_CLICKHOUSE_URL"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,205}")
RESERVED_DATABASES = frozenset({"system", "information_schema"})
"""ClickHouse's own databases (any case): never a target for kvscope's tables."""
_DEFAULT_PORTS = {"http": 8123, "https": 8443}


def default_chdb_path() -> Path:
    """The embedded chDB directory used when no target is configured."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "kvscope" / "chdb"


def validate_identifier(name: str, what: str = "database") -> str:
    """Return `name` if it is a plain ClickHouse identifier, else raise `ConfigError`.

    The whole name must match (`fullmatch`: a trailing newline is not accepted either);
    ClickHouse's own databases are refused as targets.
    """
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigError(
            f"invalid {what} name {name!r}: use letters, digits and _ (up to 206 characters)"
        )
    if what == "database" and name.lower() in RESERVED_DATABASES:
        raise ConfigError(f"{name!r} is ClickHouse's own database: choose another database name")
    return name


@dataclasses.dataclass(frozen=True)
class Target:
    """Where kvscope's tables live: a ClickHouse server or an embedded chDB directory."""

    scheme: str
    """`http`, `https` or `chdb`."""
    database: str = DEFAULT_DATABASE
    """Database holding kvscope's tables."""
    host: str = ""
    """Server host (server targets only)."""
    port: int = 0
    """Server port (server targets only)."""
    username: str = "default"
    """Server user (server targets only)."""
    password: str = dataclasses.field(default="", repr=False)
    """Server password; never shown by repr() or `safe_url`."""
    path: str = ""
    """Absolute chDB data directory (chdb targets only)."""

    @property
    def is_chdb(self) -> bool:
        """True for an embedded chDB target."""
        return self.scheme == "chdb"

    @property
    def safe_url(self) -> str:
        """The URL with the password masked: safe to log."""
        if self.is_chdb:
            return f"chdb://{self.path}?database={self.database}"
        secret = ":***" if self.password else ""
        return f"{self.scheme}://{self.username}{secret}@{self.host}:{self.port}/{self.database}"

    def __str__(self) -> str:
        return self.safe_url


def parse_target(url: str | None = None) -> Target:
    """Parse a ClickHouse target URL (None: the environment or the default chDB dir). An
    unusable URL from the environment raises `ConfigError` naming the variable."""
    if url is None:
        from_env = os.environ.get(ENV_URL)
        if from_env:
            try:
                return _parse(from_env)
            except ConfigError as exc:
                raise ConfigError(f"${ENV_URL}={from_env!r}: {exc}") from None
        url = f"chdb://{default_chdb_path()}"
    return _parse(url)


def _parse(url: str) -> Target:
    """`parse_target` of one URL."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError as exc:  # a bracketed host that is not an IPv6 address
        raise ConfigError(
            f"cannot read the ClickHouse URL ({exc}): use http(s)://user:pass@host:8123/db "
            "or chdb:///path"
        ) from None
    scheme = parts.scheme.lower()
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"database"})
    if unknown:  # a typo like ?databse= would silently use the default database
        raise ConfigError(
            f"unknown ClickHouse URL option {', '.join(map(repr, unknown))}: "
            "the only one is ?database=NAME"
        )
    if scheme == "chdb":
        raw_path = unquote(parts.netloc + parts.path)
        if not raw_path:
            raise ConfigError(f"chdb URL needs a directory, e.g. chdb:///var/lib/kvscope: {url!r}")
        path = Path(raw_path).expanduser().resolve()
        if path == Path(path.anchor):  # chdb:/// would spread chDB's files over the root
            raise ConfigError(
                f"chdb URL needs a directory, not the filesystem root, e.g. "
                f"chdb:///var/lib/kvscope: {url!r}"
            )
        database = query.get("database", [DEFAULT_DATABASE])[0]
        return Target(scheme="chdb", path=str(path), database=validate_identifier(database))
    if scheme in _DEFAULT_PORTS:
        if not hostname:
            raise ConfigError(f"ClickHouse URL needs a host: {parts.scheme}://HOST:PORT/DB")
        try:
            port = _DEFAULT_PORTS[scheme] if parts.port is None else parts.port
        except ValueError:
            port = 0
        if not port:
            raise ConfigError("ClickHouse URL has an invalid port: use 1 to 65535")
        database = parts.path.strip("/") or query.get("database", [DEFAULT_DATABASE])[0]
        return Target(
            scheme=scheme,
            host=hostname,
            port=port,
            username=unquote(parts.username) if parts.username else "default",
            password=unquote(parts.password) if parts.password else "",
            database=validate_identifier(database),
        )
    raise ConfigError(
        f"unsupported ClickHouse URL scheme {parts.scheme!r}: use http://, https:// or chdb://"
    )


def add_clickhouse_argument(parser: argparse.ArgumentParser) -> None:
    """Add the `--clickhouse URL` option every command reading or writing tables shares."""
    parser.add_argument(
        "--clickhouse",
        metavar="URL",
        default=None,
        help=(
            "http(s)://user:pass@host:8123/db or chdb:///path[?database=NAME] "
            "(default: $KVSCOPE_CLICKHOUSE_URL, else chdb://~/.local/share/kvscope/chdb)"
        ),
    )


def connect(target: Target, create_database: bool = True) -> Client:
    """A clickhouse-connect client on `target`, its default database set.

    With `create_database` the database is created when missing (migrations need it);
    without, a missing one raises `ConfigError` saying to migrate first.
    Imports clickhouse-connect lazily: the publisher side never loads it. A server that
    does not answer (or a chDB directory that cannot be opened) raises `SinkError`.
    """
    try:
        import clickhouse_connect
    except ImportError:
        raise ConfigError(
            "the collector needs clickhouse-connect: pip install 'kvscope[collector]'"
        ) from None
    if target.is_chdb and Path(target.path).exists() and not Path(target.path).is_dir():
        raise ConfigError(
            f"{target.path} is a file, not a directory: give --clickhouse chdb:///DIRECTORY "
            "(created if missing)"
        )
    if target.is_chdb:
        try:
            Path(target.path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the chDB directory {target.path} ({exc.strerror or exc}): "
                "give --clickhouse chdb:///A/WRITABLE/DIRECTORY"
            ) from None
    try:
        if target.is_chdb:
            client = clickhouse_connect.get_client(dsn=f"chdb://{target.path}")
        else:
            client = clickhouse_connect.get_client(
                host=target.host,
                port=target.port,
                username=target.username,
                password=target.password,
                secure=target.scheme == "https",
            )
    except Exception as exc:  # the driver's many error types: one line for the user
        raise SinkError(_unreachable(target, exc)) from exc
    if create_database:
        client.command(f"CREATE DATABASE IF NOT EXISTS {target.database}")
    elif not _database_exists(client, target.database):
        client.close()
        raise ConfigError(
            f"database {target.database!r} does not exist at {target.safe_url}: run "
            "`kvscope migrate` (or collect some data) first"
        )
    client.database = target.database
    return client


def _unreachable(target: Target, exc: BaseException) -> str:
    """The one line for a client that could not connect: the socket's own reason when the
    driver's error wraps one (connection refused, unknown host), else its first line."""
    cause = _socket_error(exc)
    if target.is_chdb:  # embedded: no server to be running
        reason = cause or (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return f"cannot open chDB at {target.path} ({reason}): check --clickhouse"
    if cause is not None:
        return (
            f"cannot reach ClickHouse at {target.safe_url} ({cause}); is the server running "
            "there? (check --clickhouse)"
        )
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return f"cannot reach ClickHouse at {target.safe_url}: {lines[0][:300]}"


def _socket_error(exc: BaseException) -> str | None:
    """The strerror of the innermost OSError under `exc` (through causes, contexts and
    urllib3's `reason`), or None."""
    found = None
    seen: set[int] = set()
    current: Any = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            found = current.strerror
        reason = getattr(current, "reason", None)
        current = (
            current.__cause__
            or current.__context__
            or (reason if isinstance(reason, BaseException) else None)
        )
    return found


def _database_exists(client: Client, database: str) -> bool:
    """Asked before the client's database is set: once set, every query fails without it."""
    rows = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": database}
    ).result_rows
    return bool(rows and rows[0][0])

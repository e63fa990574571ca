"""How commands reach their data: directly, through a live serve, or not at all (one clear line).

- `open_reader(target)` (for `kvscope query` and `kvscope report`): a `ServeClient` when a
  live serve holds the chDB directory, else a direct client; never creates a directory,
  and names the process when another one holds it.
- `check_writable(target)` (for `collect`, `serve`, `migrate`, `derive`): the chDB directory
  must be free; the error names the holder and what to do.
- `open_existing(target)` (for `derive`): a direct client of data that is already there
  (the same one-line errors as `open_reader` when the directory or database is missing).
- `check_kafka(bootstrap_servers)`: some bootstrap server answers as a Kafka broker,
  checked before anything is created on disk.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from kvscope.collector.errors import BrokerError
from kvscope.collector.storage.target import Target, connect
from kvscope.common.kafka import host_and_port, unbracketed
from kvscope.schemas.errors import ConfigError, KvscopeError
from kvscope.serve import kafka_probe
from kvscope.serve import state as serve_state

log = logging.getLogger(__name__)


class DirectoryBusy(KvscopeError):
    """Another process holds the embedded chDB directory (chDB allows one per directory)."""


def _busy(target: Target, pid: int, action: str) -> DirectoryBusy:
    if pid < 0:
        return DirectoryBusy(f"{target.path} is held by another process; {action}, or stop it")
    return DirectoryBusy(
        f"{target.path} is held by {serve_state.process_name(pid)}; {action}, "
        f"or stop it (kill {pid})"
    )


def check_writable(target: Target) -> None:
    """Fail with one line when another process holds the chDB directory of `target`."""
    if not target.is_chdb:
        return
    directory = Path(target.path)
    live = serve_state.live_serve(directory)
    if live is not None:
        raise DirectoryBusy(
            f"{target.path} is held by kvscope serve at {live.url} ("
            f"{serve_state.process_name(live.pid)}); it already collects: read with "
            "`kvscope query`/`kvscope report`, or stop it first"
        )
    pid = serve_state.holder_pid(directory)
    if pid is not None:
        raise _busy(target, pid, "use another --clickhouse directory")


def open_reader(target: Target, token: str | None = None) -> Any:
    """A client for the named queries on `target` (see the module docstring)."""
    from kvscope.serve.remote import ServeClient

    if target.is_chdb:
        directory = _existing_directory(target)
        live = serve_state.live_serve(directory)
        if live is not None:
            if live.database and live.database != target.database:
                raise ConfigError(
                    f"{target.path} is held by kvscope serve at {live.url}, which serves "
                    f"database {live.database!r}, not {target.database!r}: read it with "
                    f"?database={live.database}, or stop the serve to read another database"
                )
            log.debug("reading through kvscope serve at %s", live.url)
            # The serve's own record names its token; the variable only fills in without it.
            return ServeClient(
                live.url, token or live.token or os.environ.get(serve_state.TOKEN_ENV)
            )
        pid = serve_state.holder_pid(directory)
        if pid is not None:
            raise _busy(
                target,
                pid,
                "run `kvscope serve` instead of `kvscope collect` to read while collecting",
            )
    return connect(target, create_database=False)


def open_existing(target: Target) -> Any:
    """A direct client of `target`'s existing data, once its chDB directory is free."""
    if target.is_chdb:
        _existing_directory(target)
        check_writable(target)
    return connect(target, create_database=False)


def _existing_directory(target: Target) -> Path:
    directory = Path(target.path)
    if not directory.is_dir():
        raise ConfigError(
            f"no kvscope data at {target.path}: start `kvscope serve` or `kvscope collect` "
            "there first, or pass --clickhouse"
        )
    return directory


def check_kafka(
    bootstrap_servers: str,
    security_protocol: str = "PLAINTEXT",
    timeout_s: float = 3.0,
    *,
    probe: bool = True,
) -> None:
    """Raise `ConfigError` unless every bootstrap server is host:port, then `BrokerError`
    unless one of them answers as a Kafka broker.

    Over a listener without TLS, answering means a reply to Kafka's ApiVersions request
    (brokers take it before any SASL exchange), so an address of another service fails in
    `timeout_s`, not after the Kafka client's 40 s request timeout. A TLS listener
    (`security_protocol` SSL or SASL_SSL), or any listener with `probe` off, is only
    checked to accept a TCP connection.
    """
    addresses = []
    for server in bootstrap_servers.split(","):
        if "@" in server:  # never echoed: what precedes the @ may be a password
            raise ConfigError(
                "--bootstrap-servers takes host:port only: give a SASL user in "
                "$KVSCOPE_SASL_USERNAME (or --sasl-username) and its password in "
                "$KVSCOPE_SASL_PASSWORD"
            )
        address = host_and_port(server)
        if address is None:
            raise ConfigError(
                f"--bootstrap-servers {server.strip()!r}: use host:port (port 1..65535)"
            )
        addresses.append(address)
    unreachable = []
    not_kafka = []
    for host, port in addresses:
        try:
            conn = socket.create_connection((unbracketed(host), port), timeout=timeout_s)
        except OSError as exc:
            unreachable.append(f"{host}:{port}: {exc.strerror or exc}")
            continue
        with conn:
            if not probe or security_protocol.endswith("SSL"):
                return
            problem = kafka_probe.problem(conn, timeout_s)
        if problem is None:
            return
        not_kafka.append(f"{host}:{port}: {problem}")
    if not_kafka:
        raise BrokerError(
            f"Kafka at {bootstrap_servers} did not answer as a Kafka broker "
            f"({'; '.join(not_kafka + unreachable)}): check --bootstrap-servers and the "
            "security settings"
        )
    raise BrokerError(
        f"cannot reach Kafka at {bootstrap_servers} ({'; '.join(unreachable)}); is the broker "
        "running? (`kvscope broker` starts a local one)"
    )

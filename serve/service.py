"""`Serve`: the collector and the HTTP API in one process, on one ClickHouse client.

chDB allows one process per data directory, so reading while collecting means reading
through the process that collects. `Serve` opens one client, migrates, hands it to the
collector's sink and to the HTTP API, which run on one event loop (the HTTP base's uvicorn
beside the collector); `SerializedClient` makes the inserts (the collector's worker thread)
and the queries (Starlette's thread pool) take turns. For a chDB target it records its URL,
pid and token in the data directory (`state.write_state`) and removes the record on the
way out, so `kvscope query`/`kvscope report` find it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.storage.client import Client
from kvscope.common.net import open_listener_problem, token_problem
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def _serialized(name: str) -> Any:
    """A method calling the wrapped client's `name` under the lock."""

    def call(self: SerializedClient, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return getattr(self._client, name)(*args, **kwargs)

    call.__doc__ = f"`client.{name}`, serialized."
    return call


class SerializedClient:
    """A clickhouse-connect client whose calls take one lock: one call at a time.

    The collector's sink keeps its own lock around each insert; HTTP queries only take
    this one, so the two never deadlock and never run on the client at once.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._lock = threading.RLock()

    query = _serialized("query")
    command = _serialized("command")
    insert = _serialized("insert")
    insert_arrow = _serialized("insert_arrow")
    query_arrow = _serialized("query_arrow")

    def close(self) -> None:
        """Close the client."""
        with self._lock:
            self._client.close()

    @property
    def database(self) -> str:
        """The client's default database."""
        return str(self._client.database)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """The HTTP side of `kvscope serve` (the collector side is a `CollectorConfig`)."""

    host: str = DEFAULT_HOST
    """Listen address; anything but loopback needs a token."""
    port: int = DEFAULT_PORT
    """Listen port (0: any free port)."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token every request but /healthz must carry (None: no check, loopback only)."""

    def validate(self) -> ServeOptions:
        """Raise `ConfigError` for settings that cannot work or are unsafe; return self."""
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        problem = token_problem(self.token) or open_listener_problem(
            self.host, self.token, "KVSCOPE_SERVE_TOKEN", "read"
        )
        if problem:
            raise ConfigError(problem)
        return self


class Serve:
    """Collector + HTTP API in this process; `run()` blocks until stopped."""

    def __init__(self, config: CollectorConfig, options: ServeOptions) -> None:
        self.config = config.validate()
        self.options = options.validate()
        self.url: str | None = None
        self.stored_rows = 0
        self._collector: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()

    def run(self, on_ready: Callable[[Serve], None] | None = None, signals: bool = True) -> None:
        """Listen, open, migrate, collect and serve until SIGINT/SIGTERM (unless `signals`
        is off) or `request_stop()`."""
        from kvscope.collector.pipeline.service import Collector
        from kvscope.collector.pipeline.write import ClickHouseSink
        from kvscope.collector.storage.migrate import migrate
        from kvscope.collector.storage.store import store_for
        from kvscope.collector.storage.target import connect
        from kvscope.serve.api import ServeApi
        from kvscope.serve.app import build_serve_app
        from kvscope.serve.state import remove_state, write_state
        from kvscope.web.server import listen

        target = self.config.target
        sock = listen(self.options.host, self.options.port)  # before the directory exists
        try:
            client = SerializedClient(connect(target))
            store = store_for(target, client)
            try:
                migrate(client, target)
                self._collector = Collector(self.config, sink=ClickHouseSink(store))
                app = build_serve_app(ServeApi(client, target), self.options.token)

                def listening(url: str) -> None:
                    self.url = url
                    if store.embedded:
                        state = _state(url, os.getpid(), self.options.token, target.database)
                        write_state(Path(target.path), state)
                    log.info("serving on %s", url)
                    if on_ready is not None:
                        on_ready(self)

                self._serve(app, sock, listening, signals)
            finally:
                if store.embedded:
                    remove_state(Path(target.path))
                client.close()
        finally:
            sock.close()

    def _serve(
        self, app: Any, sock: socket.socket, listening: Callable[[str], None], signals: bool
    ) -> None:
        """Serve `app` and run the collector on one event loop; a stop (signal, or
        `request_stop()`) lets the collector flush and commit before this returns."""
        from kvscope.collector.pipeline import metrics
        from kvscope.web.server import serve

        before = metrics.rows_inserted()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            if self._stopping.is_set():  # asked before the loop existed
                self._collector.request_stop()
            collecting = asyncio.create_task(self._collector.run(), name="kvscope-collect")
            try:
                await serve(app, sock, self.options.host, listening, collecting, signals=signals)
            finally:
                self._collector.request_stop()
                await asyncio.wait({collecting})
            collecting.result()

        try:
            asyncio.run(main())
        finally:
            self.stored_rows = metrics.rows_inserted() - before

    def request_stop(self) -> None:
        """Ask `run()` to flush, commit and return (from any thread, also before it collects)."""
        self._stopping.set()
        if self._loop is not None and self._collector is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed: run() is done
                self._loop.call_soon_threadsafe(self._collector.request_stop)


def _state(url: str, pid: int, token: str | None, database: str) -> Any:
    from kvscope.serve.state import ServeState

    return ServeState(url=url, pid=pid, token=token, database=database)

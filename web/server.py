"""One way to serve an app: uvicorn on a socket bound first (a taken port is a one-line
`ConfigError` before anything starts), `on_ready(url)` once listening, SIGINT/SIGTERM stop
it without being re-raised afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from kvscope.common.kafka import unbracketed
from kvscope.common.net import connectable_url
from kvscope.schemas.errors import ConfigError


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking socket (port 0: any free port), IPv6 hosts included."""
    bare = unbracketed(host)
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (accepted ones inherit
    # it); without, back-to-back answers wait out Nagle + delayed ACK (44 ms each).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        change = (
            "choose another --port"
            if exc.errno == errno.EADDRINUSE
            else "give --host an address of this machine"
        )
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): {change}"
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def freeze_startup_heap() -> int:
    """Collect the garbage, then put every object alive now out of the collector's reach
    (`gc.freeze`); the count frozen. For a long-running service once it has started: its
    modules, classes and start-up state (~140k objects in a router with its index) are
    never garbage, yet every full collection walks them, 35-70 ms on this 2-core machine,
    which a request arriving then waits out. Objects made later are collected as usual."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class _Server(uvicorn.Server):
    """uvicorn's server, stopping on SIGINT/SIGTERM without re-raising them afterwards
    (uvicorn would, and the command would end as killed instead of stopped)."""

    signals = True
    """False: leave SIGINT/SIGTERM to the caller."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop on SIGINT/SIGTERM while serving (main thread only), restore after."""
        if not self.signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def serve(
    app: Any,
    sock: socket.socket,
    host: str,
    on_ready: Callable[[str], None] | None = None,
    alongside: asyncio.Task[Any] | None = None,
    *,
    signals: bool = True,
) -> None:
    """Serve `app` on `sock` until signalled (unless `signals` is off) or until `alongside`
    (a task the service runs beside the server) ends; its error, or the server's, is raised."""
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.signals = signals
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="kvscope-http")
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if on_ready is not None and server.started:
            on_ready(connectable_url(unbracketed(host), sock.getsockname()[1]))
        tasks = {serving} if alongside is None else {serving, alongside}
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        server.should_exit = True
        await asyncio.gather(serving, return_exceptions=True)

"""A real uvicorn serving an ASGI app on 127.0.0.1 in a background thread (through the HTTP
base's own `serve`), and a raw-socket client that can send what httpx will not: bodies of
any size, chunked or declared, stopping as soon as the server answers."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

from kvscope.web.server import listen, serve
from prometheus_client import REGISTRY


@contextlib.contextmanager
def live(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on a free port of `host` while the block runs; yields its base URL."""
    loop = asyncio.new_event_loop()
    sock = listen(host, 0)
    ready = threading.Event()
    urls: list[str] = []
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def listening(url: str) -> None:
        urls.append(url)
        ready.set()

    async def main() -> None:
        stopper = asyncio.create_task(stop.wait())
        await serve(app, sock, host, listening, alongside=stopper)

    def thread() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported to the test below
            failed.append(exc)
        finally:
            ready.set()

    runner = threading.Thread(target=thread, daemon=True)
    runner.start()
    ready.wait(30)
    try:
        assert urls and not failed, f"the server did not start: {failed}"
        yield urls[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        runner.join(30)
        loop.close()
        sock.close()


def raw_request(
    url: str,
    path: str,
    size: int,
    *,
    chunked: bool,
    headers: dict[str, str] | None = None,
    piece: int = 1 << 16,
) -> tuple[int | None, bytes, int]:
    """POST `size` body bytes (`[` then spaces: valid JSON prefix) to `url` + `path`,
    chunked or with Content-Length, stopping when the server answers or hangs up.

    Returns (status or None when the connection broke before an answer, the answer's
    bytes, body bytes sent)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json"]
    lines.append("transfer-encoding: chunked" if chunked else f"content-length: {size}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    answer = b""
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        block = b"[" + b" " * (piece - 1)
        try:
            while sent < size and not select.select([conn], [], [], 0)[0]:
                part = block[: min(piece, size - sent)]
                conn.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part)
                sent += len(part)
            if chunked and sent >= size:
                conn.sendall(b"0\r\n\r\n")
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server hung up while we were sending: read what it said
            pass
        with contextlib.suppress(OSError):
            while chunk := conn.recv(1 << 16):
                answer += chunk
    head = answer.split(b"\r\n", 1)[0].split()
    return (int(head[1]) if len(head) > 1 else None), answer, sent


def body_bytes(service: str) -> float:
    """Request body bytes the HTTP base of `service` let through to its handlers so far."""
    labels = {"service": service}
    return REGISTRY.get_sample_value("kvscope_http_body_bytes_read_total", labels) or 0.0

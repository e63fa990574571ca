"""A small HTTP/1.1 client for the router's two calls per request to `kvscope index`.

Why not httpx, which the router uses for the engines: its layers cost far more CPU than
the call itself. Measured on this 2-core machine (bench/route_compare.py, docs/benchmarks.md
"Router overhead"), the index's `/score` and `/routed` through httpx made the router cost
several times a bare pass-through per request; these calls only ever POST a small JSON body
to one host and read a small JSON answer, which needs no more than this: keep-alive
connections to one host (reused one request at a time), a request written in one piece, and
an answer read by its `content-length` (or chunked). A connection is closed on any error or
timeout, never reused half-read; one the server closed while idle is replaced once.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""An answer larger than this is an error (the index's largest, thousands of sources, are
well under a megabyte)."""
MAX_HEADER_BYTES = 64 * 1024
MAX_IDLE = 64
"""Idle connections kept for reuse; more are closed as they come back."""


class TransportError(Exception):
    """The request got no complete answer: connection refused or lost, or a malformed answer."""


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Http1Pool:
    """Keep-alive HTTP/1.1 connections to the host of `url` (http or https); `post()` sends
    one request on an idle connection or a new one."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._base = parts.path.rstrip("/")
        host = parts.netloc.rsplit("@", 1)[-1]
        fixed = {"Host": host, **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[Connection] = []

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST `body` to `path`: the answer's status and body. `TransportError` when no
        complete answer came, `TimeoutError` after `timeout_s`."""
        request = (
            f"POST {self._base}{path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode()
            + self._fixed
            + b"\r\n"
            + body
        )
        async with asyncio.timeout(timeout_s):
            while self._idle:
                connection = self._idle.pop()
                if connection[0].at_eof():
                    connection[1].close()
                    continue
                try:
                    return await self._exchange(connection, request)
                except _Unanswered:  # closed by the server while idle: a new one, once
                    break
            return await self._exchange(await self._connect(), request)

    async def _connect(self) -> Connection:
        try:
            return await asyncio.open_connection(
                self._host, self._port, ssl=self._ssl, limit=MAX_HEADER_BYTES
            )
        except OSError as exc:
            raise TransportError(f"cannot connect: {exc.strerror or exc}") from None

    async def _exchange(self, connection: Connection, request: bytes) -> tuple[int, bytes]:
        reader, writer = connection
        kept = False
        try:
            writer.write(request)
            try:
                status_line = await reader.readuntil(b"\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise _Unanswered(str(exc)) from None
            status, keep, answer = await _read_answer(reader, status_line)
            kept = keep
            return status, answer
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        finally:
            if kept and len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
            else:
                writer.close()

    def close(self) -> None:
        """Close the idle connections."""
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _Unanswered(TransportError):
    """Nothing came back on the connection (closed before any answer)."""


async def _read_answer(reader: asyncio.StreamReader, status_line: bytes) -> tuple[int, bool, bytes]:
    """(status, whether the connection can be reused, body) after the status line."""
    try:
        version, code = status_line.split(b" ", 2)[:2]
        status = int(code)
    except ValueError:
        raise TransportError(f"not an HTTP answer: {status_line[:80]!r}") from None
    head = await reader.readuntil(b"\r\n\r\n")
    length = None
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            keep = b"close" not in value if keep else b"keep-alive" in value
    if chunked:
        return status, keep, await _read_chunked(reader)
    if length is None:
        return status, False, await _read_to_close(reader)
    if length > MAX_ANSWER_BYTES:
        raise TransportError(f"an answer of {length} bytes")
    return status, keep, await reader.readexactly(length)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if chunk == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        size += chunk
        if size > MAX_ANSWER_BYTES:
            raise TransportError(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
        parts.append((await reader.readexactly(chunk + 2))[:-2])


async def _read_to_close(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while chunk := await reader.read(MAX_HEADER_BYTES):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise TransportError(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)

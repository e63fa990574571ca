"""The router's one HTTP client (aiohttp): engines and index, keep-alive connections.

Why aiohttp and not httpx: per small request on loopback httpx cost about 1.2-1.5 ms of the
router's CPU against about 0.3 ms through aiohttp (same server, docs/benchmarks.md "Router
overhead"), and the router makes one to four such requests per routed request (the
forwarded completion, `/tokenize`, the index's `/score` and `/routed`).

Set up as a proxy needs it: no `Accept-Encoding` or `User-Agent` of its own (the client's
pass through, or none), bodies never decompressed (the engine's encoded bytes go back with
their `content-encoding`), no redirects followed, no cookies kept, no proxy from the
environment. Two ways to call:
- `open()`: the answer's status and headers, its body still to stream (`Answer.chunks()`);
  a forwarded completion. Connecting may take `connect_timeout_s`, each read (the headers,
  every chunk) `read_timeout_s`.
- `fetch()`: a small call read whole within one deadline (health checks, `/v1/models`,
  `/tokenize`, the index); a kept connection the server closed while it sat idle is
  replaced once (every such call is safe to repeat).
Every failure is a `TransportError` saying whether anything reached the server (`kind`
connect: nothing did), or for `fetch()` a `TimeoutError` at its deadline. The session is
made on first use, inside the router's event loop; `close()` ends it (the app's lifespan).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""A `fetch()` answer larger than this is an error (health, model lists, token ids and the
index's scores are far smaller)."""
KEEPALIVE_S = 4.0
"""An idle connection is closed after this long: under the 5 s after which uvicorn (vLLM's
server, kvscope's) closes it, so a request is not sent on a connection being closed."""
NOT_SENT = ("Accept-Encoding", "User-Agent")
"""Headers aiohttp would add of its own; only the caller's are sent."""


class TransportError(Exception):
    """No complete answer: `kind` is connect (no connection: nothing was sent), timeout (no
    data within the read timeout) or protocol (connection lost, answer cut or malformed)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _failure(exc: aiohttp.ClientError) -> TransportError:
    """aiohttp's error as a `TransportError` of the right kind."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError(f"cannot connect: {exc.os_error.strerror or exc}", "connect")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return TransportError(f"cannot connect: {exc}", "connect")
    kind = "timeout" if isinstance(exc, TimeoutError) else "protocol"
    return TransportError(f"{type(exc).__name__}: {exc}", kind)


class Answer:
    """An answer whose headers have arrived; `chunks()` streams its body as it was sent
    (still encoded), `release()` frees the connection (kept only if the body was read to
    its end)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        """Case-insensitive."""

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body chunk by chunk as it arrives (an engine's HTTP chunks one by one, so a
        stream's events are passed on as they were sent); `TransportError` when it breaks
        off."""
        try:
            async for chunk, _ in self._response.content.iter_chunks():
                if chunk:
                    yield chunk
        except aiohttp.ClientError as exc:
            raise _failure(exc) from None

    def release(self) -> None:
        """Give the connection back (closed unless the body was read whole)."""
        self._response.release()


class HttpClient:
    """One aiohttp session for every call the router makes (see the module doc)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def _current(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=NOT_SENT,
                auto_decompress=False,
            )
        return session

    async def _send(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.ClientResponse:
        return await self._current().request(
            method, url, data=body or None, headers=headers, allow_redirects=False
        )

    async def open(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """Send one request; its `Answer` once the headers arrived (`TransportError` if not)."""
        try:
            return Answer(await self._send(method, url, body, headers))
        except aiohttp.ClientError as exc:
            raise _failure(exc) from None

    async def fetch(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        timeout_s: float,
        body: bytes = b"",
    ) -> tuple[int, bytes]:
        """One small call read whole: the answer's status and body. `TransportError` when
        no complete answer came, `TimeoutError` after `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            try:
                try:
                    response = await self._send(method, url, body, headers)
                except aiohttp.ServerDisconnectedError:  # a kept connection closed while idle
                    response = await self._send(method, url, body, headers)
                try:
                    return response.status, await _read_whole(response)
                finally:
                    response.release()
            except aiohttp.ClientError as exc:
                raise _failure(exc) from None

    async def close(self) -> None:
        """Close every connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_whole(response: aiohttp.ClientResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise TransportError(f"an answer of more than {MAX_ANSWER_BYTES} bytes", "protocol")
        parts.append(chunk)
    return b"".join(parts)

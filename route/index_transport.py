"""The router's connection to `kvscope index` for its two calls per request (aiohttp).

`POST /score` before the choice and `POST /routed` after it go through aiohttp rather than
httpx, which the router uses for the engines: per small JSON POST on loopback httpx cost
about 1.2-1.5 ms of the router's CPU against about 0.3 ms through aiohttp (same server,
docs/benchmarks.md "Router overhead"), and the HTTP-index path makes two such calls per
request. Keep-alive connections to the index's host; an answer is read whole, up to
`MAX_ANSWER_BYTES`. A call that runs out of time raises `TimeoutError` (the router's gate
counts it as the index budget running out); any other failure `TransportError`.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""An answer larger than this is an error (the index's largest, thousands of sources, are
well under a megabyte)."""
_NO_CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=None)
"""Each call's own deadline (`asyncio.timeout`) bounds it, not aiohttp's defaults."""


class TransportError(Exception):
    """The call got no complete answer: connection refused or lost, or a malformed answer."""


class IndexTransport:
    """Keep-alive connections to the index at `url` (http or https); `post()` sends one
    request and returns its status and body. The session is made on first use, inside the
    router's event loop."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._base = url.rstrip("/")
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST `body` to `path`: the answer's status and body. `TransportError` when no
        complete answer came, `TimeoutError` after `timeout_s`. A connection the index
        closed while it sat idle is replaced once (both calls are safe to repeat)."""
        async with asyncio.timeout(timeout_s):
            try:
                try:
                    return await self._exchange(path, body)
                except aiohttp.ServerDisconnectedError:
                    return await self._exchange(path, body)
            except aiohttp.ClientConnectorError as exc:
                raise TransportError(f"cannot connect: {exc.os_error.strerror or exc}") from None
            except aiohttp.ClientError as exc:
                raise TransportError(f"{type(exc).__name__}: {exc}") from None

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        session = self._session
        if session is None or session.closed:
            session = self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=_NO_CLIENT_TIMEOUT
            )
        async with session.post(self._base + path, data=body) as answer:
            parts: list[bytes] = []
            size = 0
            async for chunk in answer.content.iter_any():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise TransportError(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
                parts.append(chunk)
            return answer.status, b"".join(parts)

    async def close(self) -> None:
        """Close the connections to the index."""
        if self._session is not None:
            await self._session.close()
            self._session = None

"""The router's connection to `kvscope index` for its two calls per request and its health
poll, over the router's one HTTP client (`http_client`, aiohttp: per small JSON POST on
loopback httpx cost about 1.2-1.5 ms of the router's CPU against about 0.3 ms through aiohttp,
docs/benchmarks.md "Router overhead", and the HTTP-index path makes two such calls per
request). Keep-alive connections to the index's host; an answer is read whole. A call that
runs out of time raises `TimeoutError` (the router's gate counts it as the index budget
running out); any other failure `TransportError`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from kvscope.route.http_client import HttpClient, TransportError

__all__ = ["IndexTransport", "TransportError"]


class IndexTransport:
    """Calls to the index at `url` (http or https) with `headers` (its token) through
    `client`; each returns the answer's status and body."""

    def __init__(self, url: str, headers: dict[str, str], client: HttpClient) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._base = url.rstrip("/")
        self._headers = headers
        self._client = client

    async def post(self, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST `body` to `path`: the answer's status and body. `TransportError` when no
        complete answer came, `TimeoutError` after `timeout_s`. A connection the index
        closed while it sat idle is replaced once (both calls are safe to repeat)."""
        return await self._client.fetch("POST", self._base + path, self._headers, timeout_s, body)

    async def get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        """GET `path`, as `post()`."""
        return await self._client.fetch("GET", self._base + path, self._headers, timeout_s)

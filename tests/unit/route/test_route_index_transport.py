"""The router's connection to the index (`kvscope.route.index_transport` over the router's
one `http_client.HttpClient`): against uvicorn for answers as a real server sends them, and
against a raw asyncio server for the faults uvicorn cannot produce on demand (a connection
closed while idle, a garbled answer, none)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kvscope.local.broker import free_port
from kvscope.route.http_client import HttpClient
from kvscope.route.index_transport import IndexTransport, TransportError
from support.route_fleet import Servers


@asynccontextmanager
async def transport(
    url: str, headers: dict[str, str] | None = None
) -> AsyncIterator[IndexTransport]:
    """An `IndexTransport` to `url` on a client of the router's default timeouts, closed after."""
    client = HttpClient(connect_timeout_s=2.0, read_timeout_s=600.0)
    try:
        yield IndexTransport(url, headers or {}, client)
    finally:
        await client.close()


def echo_app(peers: list[Any]) -> Callable[..., Awaitable[None]]:
    """An ASGI app answering every POST with its body's length, path and a header, as one
    piece (content-length) or in chunks (`?chunked`); the client address of every request
    goes to `peers`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        peers.append(scope["client"])
        headers = dict(scope["headers"])
        answer = json.dumps({"size": len(body), "path": scope["path"],
                             "auth": headers.get(b"authorization", b"").decode(),
                             "pad": "x" * len(body)}).encode()  # fmt: skip
        chunked = scope["query_string"] == b"chunked"
        sent = [(b"content-type", b"application/json")]
        if not chunked:
            sent.append((b"content-length", str(len(answer)).encode()))
        await send({"type": "http.response.start", "status": 201, "headers": sent})
        if chunked:
            for start in range(0, len(answer), 1000):
                part = answer[start : start + 1000]
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"" if chunked else answer})

    return app


@pytest.mark.parametrize("size", [0, 1, 999, 70_000])
@pytest.mark.parametrize("chunked", [False, True])
def test_answers_come_back_whole_on_one_kept_connection(size: int, chunked: bool) -> None:
    peers: list[Any] = []
    with Servers() as servers:
        url = servers.start(echo_app(peers))

        async def run() -> list[tuple[int, bytes]]:
            async with transport(url + "/base/", {"Authorization": "Bearer t"}) as pool:
                path = "/score?chunked" if chunked else "/score"
                return [await pool.post(path, b"y" * size, 5) for _ in range(3)]

        answers = asyncio.run(run())
    for status, body in answers:
        assert status == 201
        assert json.loads(body) == {"size": size, "path": "/base/score", "auth": "Bearer t",
                                    "pad": "x" * size}  # fmt: skip
    assert len(peers) == 3 and len(set(peers)) == 1  # one connection, kept


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A raw TCP server on loopback running `handler` per connection; its URL."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


@pytest.mark.parametrize("requests", [2, 5])
def test_a_connection_the_server_closed_while_idle_is_replaced(requests: int) -> None:
    connections = []

    async def answer_once_then_close(reader: asyncio.StreamReader, writer: Any) -> None:
        connections.append(1)
        body = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()  # no `Connection: close`: the client learns it on its next request

    async def run() -> list[tuple[int, bytes]]:
        async with raw_server(answer_once_then_close) as url, transport(url) as pool:
            answers = []
            for n in range(requests):
                answers.append(await pool.post("/x", b"%d" % n, 5))
                await asyncio.sleep(0.05)  # the close reaches the client's idle connection
            return answers

    assert asyncio.run(run()) == [(200, b"%d" % n) for n in range(requests)]
    assert len(connections) == requests


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    ],
)
def test_a_garbled_or_cut_answer_is_a_transport_error(answer: bytes) -> None:
    async def garble(reader: asyncio.StreamReader, writer: Any) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def run() -> None:
        async with raw_server(garble) as url, transport(url) as pool:
            with pytest.raises(TransportError):
                await pool.post("/x", b"{}", 5)

    asyncio.run(run())


@pytest.mark.parametrize("closes", [2, 3])
def test_a_server_that_closes_without_answering_is_a_transport_error(closes: int) -> None:
    """Closed at once on every connection: the one retry meets the same, and the caller
    gets a `TransportError` (never aiohttp's own exception)."""
    connections: list[int] = []

    async def hang_up(reader: asyncio.StreamReader, writer: Any) -> None:
        connections.append(1)
        await read_request(reader)
        writer.close()

    async def run() -> None:
        async with raw_server(hang_up) as url, transport(url) as pool:
            for _ in range(closes - 1):
                with pytest.raises(TransportError):
                    await pool.post("/x", b"{}", 5)

    asyncio.run(run())
    assert len(connections) == 2 * (closes - 1)


def test_no_answer_is_a_timeout_and_the_connection_is_not_reused() -> None:
    connections: list[int] = []

    async def silent_first(reader: asyncio.StreamReader, writer: Any) -> None:
        connections.append(1)
        body = await read_request(reader)
        if len(connections) == 1:
            await asyncio.sleep(10)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async def run() -> tuple[int, bytes]:
        async with raw_server(silent_first) as url, transport(url) as pool:
            with pytest.raises(TimeoutError):
                await pool.post("/x", b"1", 0.1)
            return await pool.post("/x", b"2", 5)

    assert asyncio.run(run()) == (200, b"2")
    assert len(connections) == 2


def test_a_refused_connection_is_a_transport_error() -> None:
    async def run() -> None:
        async with transport(f"http://127.0.0.1:{free_port()}") as pool:
            with pytest.raises(TransportError, match="cannot connect") as refused:
                await pool.post("/x", b"{}", 5)
        assert refused.value.kind == "connect"

    asyncio.run(run())


@pytest.mark.parametrize("url", ["ftp://host/", "http://", "index:8200"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        IndexTransport(url, {}, HttpClient(2.0, 600.0))

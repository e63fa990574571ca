"""The HTTP base over a real uvicorn on 127.0.0.1: body limits while reading (declared and
chunked, around the limit), the token, JSON 404/405/413/500, no slash redirects, the port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kvscope.schemas.errors import ConfigError
from kvscope.web.app import build_app
from kvscope.web.errors import Refusal, plain_shape
from kvscope.web.limits import query_int, read_json_body
from kvscope.web.server import listen
from prometheus_client import REGISTRY
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.live_http import body_bytes, live, raw_request

LIMIT = 64 << 10
TOKEN = "web-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def echo(request: Request) -> JSONResponse:
    """How many bytes of body the handler got."""
    return JSONResponse({"bytes": len(await read_json_body(request))})


async def items(request: Request) -> JSONResponse:
    """`n` parsed strictly."""
    return JSONResponse({"n": query_int(request.query_params, "n", 1, 1, 100)})


async def boom(request: Request) -> JSONResponse:
    """A handler bug."""
    raise RuntimeError("a bug\nover two lines")


async def healthz(request: Request) -> JSONResponse:
    """Public."""
    return JSONResponse({"ok": True})


def app(token: str | None = TOKEN) -> Any:
    routes = [
        Route("/echo", echo, methods=["POST"]),
        Route("/items", items),
        Route("/boom", boom),
        Route("/healthz", healthz),
    ]
    return build_app(routes, service="test", shape=plain_shape, max_body_bytes=LIMIT, token=token)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with live(app()) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url) as http:
        yield http


def read() -> float:
    """Body bytes the base let through to the handlers so far."""
    return body_bytes("test")


def refused() -> float:
    """Requests the base refused for their body size so far."""
    labels = {"service": "test", "reason": "body_size"}
    return REGISTRY.get_sample_value("kvscope_http_refused_requests_total", labels) or 0


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1, 2 * LIMIT, 20 << 20])
def test_bodies_around_the_limit(url: str, size: int, chunked: bool) -> None:
    before, refusals = read(), refused()
    status, answer, sent = raw_request(url, "/echo", size, chunked=chunked, headers=AUTH)
    got = read() - before
    assert refused() - refusals == (size > LIMIT)
    body = answer.rsplit(b"\r\n\r\n", 1)[-1]
    assert b"application/json" in answer and b"Traceback" not in answer
    if size <= LIMIT:
        assert status == 200 and body == b'{"bytes":%d}' % size and got == size
    else:
        assert status == 413 and b"--max-body-bytes" in body
        assert got <= LIMIT  # what the handlers were let read stays within the limit
        assert chunked or got == 0  # a declared length is refused before any body byte
    if size == 20 << 20:
        assert sent < size  # answered before the client finished sending


def test_a_300_mb_chunked_body_is_refused_while_read(url: str) -> None:
    before = read()
    status, _, sent = raw_request(url, "/echo", 300 << 20, chunked=True, headers=AUTH)
    assert status == 413
    assert read() - before <= LIMIT
    assert sent < 300 << 20


def test_a_non_numeric_content_length_is_refused(url: str) -> None:
    with socket.create_connection(tuple(url[7:].rsplit(":", 1))) as conn:  # type: ignore[arg-type]
        conn.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1e9\r\n\r\n")
        assert conn.recv(1024).split()[1] in (b"400", b"413")


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),
        (f"BEARER  {TOKEN}", 200),
        (f"Bearer {TOKEN}x", 401),
        (f"Basic {TOKEN}", 401),
        (TOKEN, 401),
        ("Bearer", 401),
        ("", 401),
        ("Bearer é", 401),
    ],
)
def test_the_bearer_token(client: httpx.Client, header: str, status: int) -> None:
    answer = client.get("/items", headers={"Authorization": header.encode("latin-1")})
    assert answer.status_code == status
    if status == 401:
        assert answer.json() == {"error": "missing or wrong bearer token"}
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/items/", 404),
        ("POST", "/echo/", 404),
        ("GET", "/echo", 405),
        ("GET", "/boom", 500),
        ("GET", "/items?n=--5", 400),
        ("GET", "/items?n=²", 400),
        ("GET", "/items?n=" + "9" * 5000, 400),
        ("GET", "/items?n=101", 400),
        ("POST", "/echo", 400),
    ],
)
def test_errors_are_one_line_json(
    client: httpx.Client, method: str, path: str, status: int
) -> None:
    body = b"[" * 30_000 + b"]" * 30_000 if method == "POST" else None  # within the limit
    answer = client.request(method, path, headers=AUTH, content=body)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    message = answer.json()["error"]
    assert message and "\n" not in message and "Traceback" not in message


def test_a_taken_port_is_a_one_line_config_error() -> None:
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}") as error:
            listen("127.0.0.1", port)
        assert "\n" not in str(error.value) and "--port" in str(error.value)
    finally:
        taken.close()


def test_ipv6_loopback_and_no_delay() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        sock = listen("[::1]", 0)
    except ConfigError:
        pytest.skip("no IPv6 loopback here")
    with sock:
        assert sock.family == socket.AF_INET6
        assert sock.proto == socket.IPPROTO_TCP


def test_an_open_app_needs_no_token() -> None:
    with live(app(token=None)) as base:
        assert httpx.get(f"{base}/items?n=7").json() == {"n": 7}


class Teapot(Refusal):
    """A service's own refusal."""

    status = 418
    kind = "teapot"


async def teapot(request: Request) -> JSONResponse:
    """Refuses in the service's own terms."""
    raise Teapot("short and\nstout")


def kinded(status: int, message: str, kind: str | None) -> dict[str, Any]:
    """A shape that names the error's type."""
    return {"code": status, "message": message, "type": kind}


def test_a_services_refusal_is_answered_in_its_shape() -> None:
    routes = [Route("/teapot", teapot)]
    with live(build_app(routes, service="test", shape=kinded, max_body_bytes=LIMIT)) as base:
        refused, missing = httpx.get(f"{base}/teapot"), httpx.get(f"{base}/nope")
    assert refused.status_code == 418
    assert refused.json() == {"code": 418, "message": "short and stout", "type": "teapot"}
    assert missing.status_code == 404 and missing.json()["type"] is None


def test_a_handler_bug_is_a_500_and_the_connection_stays_usable(client: httpx.Client) -> None:
    for _ in range(3):
        crashed = client.get("/boom", headers=AUTH)
        assert crashed.status_code == 500
        assert crashed.json() == {"error": "internal error: RuntimeError"}
        assert client.get("/items?n=3", headers=AUTH).json() == {"n": 3}

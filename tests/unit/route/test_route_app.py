"""`kvscope route`'s HTTP side without engines: every refusal is a JSON error with the right
status (bad input 4xx, no engine 503; an unreachable index is never one), never a traceback.

Engines and index are closed loopback ports (nothing listens): real refused connections.
The hostile inputs go to the app served by a real uvicorn on 127.0.0.1 (the HTTP base's
limits in place).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from kvscope.local.broker import free_port
from kvscope.route.app import build_app
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.schemas.errors import ConfigError
from prometheus_client import REGISTRY
from support.live_http import body_bytes, live, raw_request

TOKEN = "route-token-0123456789"


def dead_engines(count: int) -> tuple[EngineSpec, ...]:
    return tuple(EngineSpec(f"dead-{i}", f"http://127.0.0.1:{free_port()}") for i in range(count))


def run(
    config: RouteConfig, exercise: Callable[[httpx.AsyncClient], Awaitable[Any]], lifespan: bool
) -> Any:
    """Run `exercise` against the app of `config` (its startup and shutdown too if `lifespan`)."""
    app = build_app(config)

    async def main() -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://route") as client:
            if not lifespan:
                return await exercise(client)
            async with app.router.lifespan_context(app):
                return await exercise(client)

    return asyncio.run(main())


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def assert_error(answer: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert error["type"] == kind and error["code"] == status and error["message"]
    assert "Traceback" not in answer.text
    return error


BAD = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b'"text"'),
    ("/v1/completions", json.dumps({"model": "m"}).encode()),
    ("/v1/completions", json.dumps({"prompt": ""}).encode()),
    ("/v1/completions", json.dumps({"prompt": []}).encode()),
    ("/v1/completions", json.dumps({"prompt": [1.5, 2]}).encode()),
    ("/v1/completions", json.dumps({"prompt": [True, 2]}).encode()),
    ("/v1/completions", json.dumps({"prompt": [[1], []]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "model": 7}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "stream": "yes"}).encode()),
    ("/v1/chat/completions", json.dumps({"model": "m"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": []}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": ["hi"]}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": {"role": "user"}}).encode()),
    ("/v1/chat/completions", b""),
]


@pytest.mark.parametrize("with_index", [False, True])
def test_bad_input_is_a_400_json_error(with_index: bool) -> None:
    index = f"http://127.0.0.1:{free_port()}" if with_index else None
    config = RouteConfig(engines=dead_engines(2), index_url=index)

    async def exercise(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.post(path, content=body) for path, body in BAD]

    for answer in run(config, exercise, lifespan=False):
        assert_error(answer, 400, "invalid_request_error")


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7], [8]], list(range(3, 3000))])
def test_an_unreachable_index_is_no_503_of_its_own(prompt: list[Any]) -> None:
    index = f"http://127.0.0.1:{free_port()}"
    config = RouteConfig(engines=dead_engines(2), index_url=index, index_timeout_s=0.5)
    before = metric("kvscope_route_index_errors_total", call="score")

    async def post(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/completions", json={"model": "m", "prompt": prompt})

    error = assert_error(run(config, post, lifespan=False), 503, "no_engine_available")
    assert "index" not in error["message"]  # the engines' fault, not the index's
    assert metric("kvscope_route_index_errors_total", call="score") == before + 1


@pytest.mark.parametrize("count", [1, 2, 4])
def test_dead_engines_are_skipped_until_none_is_left(count: int) -> None:
    engines = dead_engines(count)
    config = RouteConfig(engines=engines, connect_timeout_s=0.5)
    before = [metric("kvscope_route_engine_errors_total", engine=e.name, kind="connect")
              for e in engines]  # fmt: skip

    async def exercise(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        routed = await client.post("/v1/completions", json={"prompt": "hello"})
        return routed, await client.get("/healthz")

    routed, health = run(config, exercise, lifespan=False)
    assert_error(routed, 503, "no_engine_available")
    for engine, was in zip(engines, before, strict=True):  # each tried once, then skipped
        assert metric("kvscope_route_engine_errors_total", engine=engine.name, kind="connect") == (
            was + 1
        )
        assert metric("kvscope_route_engine_up", engine=engine.name) == 0
        assert metric("kvscope_route_in_flight", engine=engine.name) == 0
    assert health.status_code == 503
    assert health.json() == {"ok": False, "engines": {e.name: "down" for e in engines},
                             "index": {"state": "none"}}  # fmt: skip


def test_health_checks_at_startup_mark_dead_engines_down() -> None:
    engines = dead_engines(2)
    config = RouteConfig(engines=engines, connect_timeout_s=0.5)

    async def exercise(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        return await client.get("/healthz"), await client.get("/v1/models")

    health, models = run(config, exercise, lifespan=True)
    assert health.json()["engines"] == {e.name: "down" for e in engines}
    for engine in engines:
        assert metric("kvscope_route_engine_errors_total", engine=engine.name, kind="health") >= 1
    assert_error(models, 503, "no_engine_available")


def test_token_guards_every_route_but_healthz() -> None:
    config = RouteConfig(engines=dead_engines(1), token=TOKEN)

    async def exercise(client: httpx.AsyncClient) -> list[httpx.Response]:
        wrong = {"Authorization": "Bearer nope"}
        right = {"Authorization": f"Bearer {TOKEN}"}
        return [
            await client.post("/v1/completions", json={"prompt": "x"}),
            await client.post("/v1/chat/completions", json={"messages": []}, headers=wrong),
            await client.get("/v1/models"),
            await client.get("/metrics", headers=wrong),
            await client.get("/healthz"),
            await client.get("/metrics", headers=right),
            await client.post("/v1/completions", json={"prompt": ""}, headers=right),
        ]

    answers = run(config, exercise, lifespan=False)
    for answer in answers[:4]:
        assert_error(answer, 401, "authentication_error")
    assert answers[4].status_code == 200
    assert "kvscope_route_overhead_seconds" in answers[5].text
    assert_error(answers[6], 400, "invalid_request_error")


def test_unknown_routes_and_methods_are_json_errors() -> None:
    config = RouteConfig(engines=dead_engines(1))

    async def exercise(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.get("/v1/embeddings"), await client.get("/v1/completions")]

    missing, method = run(config, exercise, lifespan=False)
    assert_error(missing, 404, "invalid_request_error")
    assert_error(method, 405, "invalid_request_error")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_routing_by_the_index_needs_the_model(path: str) -> None:
    config = RouteConfig(engines=dead_engines(1), index_url=f"http://127.0.0.1:{free_port()}")
    body = {"prompt": [1, 2, 3]} if path == "/v1/completions" else {"messages": [{"a": 1}]}

    async def exercise(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(path, json=body)

    error = assert_error(run(config, exercise, lifespan=False), 400, "invalid_request_error")
    assert "'model' is required" in error["message"]


@pytest.fixture(scope="module")
def served() -> Iterator[httpx.Client]:
    """A router with a token and the default limits, served by uvicorn on loopback."""
    with (
        live(build_app(RouteConfig(engines=dead_engines(1), token=TOKEN))) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        yield http


HOSTILE = [
    ("post", "/v1/completions", b'{"prompt": "caf\xe9"}', 400),
    ("post", "/v1/chat/completions", b'{"messages": [{"content": "\xff\xfe"}]}', 400),
    ("post", "/v1/completions", b"[" * 200_000 + b"]" * 200_000, 400),
    ("post", "/v1/completions", b'{"prompt": "x", "n": ' + b"[" * 65 + b"]" * 65 + b"}", 400),
    ("post", "/v1/completions", b"[" * 200_000, 400),
    ("post", "/v1/completions/", b'{"prompt": "x"}', 404),
    ("get", "/v1/embeddings", None, 404),
    ("get", "/v1/completions", None, 405),
    ("put", "/metrics", None, 405),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), HOSTILE)
def test_hostile_input_over_http_is_a_json_4xx(
    served: httpx.Client, method: str, path: str, body: bytes | None, status: int
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = served.request(method, path, content=body, headers=headers)
    error = assert_error(answer, status, "invalid_request_error")
    assert "\n" not in error["message"]


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BeArEr"])
def test_the_scheme_is_case_insensitive(served: httpx.Client, scheme: str) -> None:
    assert served.get("/metrics", headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200
    wrong = served.get("/metrics", headers={"Authorization": f"{scheme} {TOKEN}-"})
    assert_error(wrong, 401, "authentication_error")


@pytest.mark.parametrize(
    ("size", "chunked"), [(20 << 20, False), (20 << 20, True), (300 << 20, True)]
)
def test_huge_prompts_are_refused_while_read(
    served: httpx.Client, size: int, chunked: bool
) -> None:
    before = body_bytes("route")
    url = str(served.base_url).rstrip("/")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    status, answer, sent = raw_request(
        url, "/v1/completions", size, chunked=chunked, headers=headers
    )
    assert status == 413
    error = json.loads(answer.rsplit(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == 413 and error["type"] == "invalid_request_error"
    assert body_bytes("route") - before <= RouteConfig.max_body_bytes
    assert sent < size


@pytest.mark.parametrize("limit", [0, 1023, (1 << 30) + 1])
def test_a_body_limit_that_cannot_work_names_the_flag(limit: int) -> None:
    with pytest.raises(ConfigError, match="--max-body-bytes must be"):
        build_app(RouteConfig(engines=dead_engines(1), max_body_bytes=limit))

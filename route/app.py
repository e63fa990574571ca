"""`kvscope route`'s HTTP side: the OpenAI-compatible routes on Starlette, served by uvicorn.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (routed; answers, streamed
or not, passed through chunk by chunk with an `x-kvscope-engine` header naming the engine
and a `Server-Timing` header: `kvscope-route` the routing overhead, `tokenize` and `score`
its stages, in ms),
`GET /v1/models` (from any engine that is up), `GET /healthz` (200 while an engine can be
routed to, else 503; the engines' and the index's states reported),
`GET /metrics` (Prometheus). With a token every route but /healthz needs
`Authorization: Bearer TOKEN`. Every error is an OpenAI-style JSON body
(`{"error": {"message", "type", "code"}}`), never a traceback. The body limit, token
check, JSON checks and the server are the HTTP base's (`kvscope.web`).

Needs the `route` extra (starlette, uvicorn, aiohttp); `load()` says how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from kvscope.route.config import RouteConfig
from kvscope.route.embedded import EmbeddedIndex
from kvscope.route.engines import Fleet
from kvscope.route.index_client import HttpIndexClient, IndexClient
from kvscope.route.index_gate import IndexGate, embedded_health
from kvscope.route.proxy import CHAT, COMPLETIONS, Router, engine_auth
from kvscope.route.tokens import EngineTokenizer, LocalTokenizer, PromptTokenizer
from kvscope.schemas.errors import ConfigError

if TYPE_CHECKING:
    from kvscope.index.stored import SnapshotReader

INSTALL_HINT = "kvscope route needs the route extra: pip install 'kvscope[route]'"


def load() -> None:
    """Raise `ConfigError` with the install hint when the route extra is missing."""
    try:
        import aiohttp  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None


_KINDS = {401: "authentication_error", 500: "internal_error"}


def error_shape(status: int, message: str, kind: str | None = None) -> Mapping[str, Any]:
    """Every error answer in the OpenAI shape vLLM answers with too; the type is the
    `RouteError`'s own, else chosen from the status (the HTTP base's refusals)."""
    kind = kind or _KINDS.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "code": status}}


def build_app(
    config: RouteConfig,
    *,
    index: IndexClient | None = None,
    tokenizer: PromptTokenizer | None = None,
    snapshots: SnapshotReader | None = None,
) -> Any:
    """The Starlette app of `config`. `index` replaces the HTTP index client (an in-process
    `InProcessIndexClient`); `tokenizer` replaces the `--tokenizer`/engine choice;
    `snapshots` is where an embedded index (`config.embedded_index`) cold starts from."""
    load()
    from kvscope.route.http_client import HttpClient
    from kvscope.route.relay import Relayed
    from kvscope.web.app import build_app as build_base
    from kvscope.web.health import Readiness, health_routes
    from kvscope.web.limits import read_json_body
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    config.validate()
    client = HttpClient(config.connect_timeout_s, config.request_timeout_s)
    fleet = Fleet(config)
    if index is None and config.index_url is not None:
        index = HttpIndexClient(
            client, config.index_url, token=config.index_token, timeout_s=config.index_timeout_s
        )
    embedded = EmbeddedIndex(config.embedded_index, snapshots) if config.embedded_index else None
    if index is None and embedded is not None:
        index = embedded.client()
    gate = IndexGate(index, config.index_timeout_s, embedded_health(embedded), live=bool(embedded))
    if tokenizer is None:
        tokenizer = (
            LocalTokenizer(config.tokenizer)
            if config.tokenizer
            else EngineTokenizer(client, fleet, config.tokenize_timeout_s, engine_auth(config))
        )
    router = Router(config, client, fleet, gate, tokenizer)

    async def routed(request: Request) -> Response:
        started = time.perf_counter()
        raw = await read_json_body(request)
        opened = await router.route(request.url.path, raw, request.headers, started)
        return Relayed(opened)

    async def models(request: Request) -> Response:
        opened = await router.forward_any("GET", "/v1/models", request.headers)
        return Relayed(opened)

    def readiness() -> Readiness:
        up = fleet.up_names()
        where = embedded.describe() if embedded else config.index_url
        index_state = {"at": where, **gate.describe()} if where else gate.describe()
        engines = {n: fleet.describe(n) for n in fleet.engines}
        return Readiness(bool(up), {"ok": bool(up), "engines": engines, "index": index_state})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            if embedded is not None:
                await stack.enter_async_context(embedded.feeding())
            await stack.enter_async_context(router.watching())
            yield

    return build_base(
        [
            Route(COMPLETIONS, routed, methods=["POST"]),
            Route(CHAT, routed, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            *health_routes(readiness),
        ],
        service="route",
        shape=error_shape,
        max_body_bytes=config.max_body_bytes,
        token=config.token,
        lifespan=lifespan,
    )


def serve(
    config: RouteConfig,
    on_ready: Callable[[str], None],
    snapshots: SnapshotReader | None = None,
) -> None:
    """Run the router until SIGINT/SIGTERM; `on_ready(url)` once it listens. `snapshots`:
    where an embedded index cold starts from."""
    load()
    from kvscope.web.server import listen
    from kvscope.web.server import serve as serve_app

    sock = listen(config.host, config.port)  # a taken port fails first
    try:
        app = build_app(config, snapshots=snapshots)
        asyncio.run(serve_app(app, sock, config.host, on_ready))
    finally:
        sock.close()

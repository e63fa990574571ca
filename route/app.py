"""`kvscope route`'s HTTP side: the OpenAI-compatible routes on Starlette, served by uvicorn.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (routed; answers, streamed
or not, passed through chunk by chunk with an `x-kvscope-engine` header naming the engine
and a `Server-Timing` header: `kvscope-route` the routing overhead, `tokenize` and `score`
its stages, in ms),
`GET /v1/models` (from any engine that is up), `GET /healthz` (200 while an engine can be
routed to, else 503; the engines' and the index's states reported),
`GET /metrics` (Prometheus). With a token every route but /healthz needs
`Authorization: Bearer TOKEN`. Every error is an OpenAI-style JSON body
(`{"error": {"message", "type", "code"}}`), never a traceback.

Needs the `route` extra (starlette, uvicorn, httpx); `load()` says how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvscope.common.kafka import unbracketed
from kvscope.common.net import connectable_url
from kvscope.route.config import RouteConfig
from kvscope.route.embedded import EmbeddedIndex
from kvscope.route.engines import Fleet
from kvscope.route.errors import RouteError
from kvscope.route.index_client import HttpIndexClient, IndexClient
from kvscope.route.index_gate import IndexGate, embedded_health
from kvscope.route.proxy import CHAT, COMPLETIONS, Router, engine_auth
from kvscope.route.tokens import EngineTokenizer, LocalTokenizer, PromptTokenizer
from kvscope.schemas.errors import ConfigError

if TYPE_CHECKING:
    from kvscope.index.stored import SnapshotReader

log = logging.getLogger(__name__)
INSTALL_HINT = "kvscope route needs the route extra: pip install 'kvscope[route]'"


def load() -> None:
    """Raise `ConfigError` with the install hint when the route extra is missing."""
    try:
        import httpx  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None


def error_body(status: int, kind: str, message: str) -> dict[str, Any]:
    """The OpenAI error shape vLLM answers with too."""
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
    import httpx
    from kvscope.route.relay import Relayed
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    config.validate()
    timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s, pool=None)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    for chatty in ("httpx", "httpcore"):  # an INFO line per request otherwise
        logging.getLogger(chatty).setLevel(logging.WARNING)
    client = httpx.AsyncClient(timeout=timeout, limits=limits)
    del client.headers["accept-encoding"]  # the client's own passes through, or none
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
    expected = f"Bearer {config.token}".encode() if config.token else None

    def json_error(status: int, kind: str, message: str) -> Response:
        return JSONResponse(error_body(status, kind, message), status_code=status)

    def authorized(request: Request) -> bool:
        if expected is None:
            return True
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(given, expected)

    def guarded(
        handler: Callable[[Request], Any],
    ) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            if not authorized(request):
                return json_error(401, "authentication_error", "missing or wrong bearer token")
            try:
                response: Response = await handler(request)
                return response
            except RouteError as exc:
                return json_error(exc.status, exc.kind, str(exc))

        return run

    async def routed(request: Request) -> Response:
        started = time.perf_counter()
        raw = await request.body()
        opened = await router.route(request.url.path, raw, request.headers, started)
        return Relayed(opened)

    async def models(request: Request) -> Response:
        opened = await router.forward_any("GET", "/v1/models", request.headers)
        return Relayed(opened)

    async def healthz(request: Request) -> Response:
        up = fleet.up_names()
        where = embedded.describe() if embedded else config.index_url
        index_state = {"at": where, **gate.describe()} if where else gate.describe()
        return JSONResponse(
            {
                "ok": bool(up),
                "engines": {n: fleet.describe(n) for n in fleet.engines},
                "index": index_state,
            },
            status_code=200 if up else 503,
        )

    async def prometheus(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return json_error(status, "invalid_request_error", f"{request.url.path}: {detail}")

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return json_error(500, "internal_error", f"internal error: {type(exc).__name__}")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(client.aclose)
            if embedded is not None:
                await stack.enter_async_context(embedded.feeding())
            await stack.enter_async_context(router.watching())
            yield

    return Starlette(
        routes=[
            Route(COMPLETIONS, guarded(routed), methods=["POST"]),
            Route(CHAT, guarded(routed), methods=["POST"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/metrics", guarded(prometheus), methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: crashed},
        lifespan=lifespan,
    )


def serve(
    config: RouteConfig,
    on_ready: Callable[[str], None],
    snapshots: SnapshotReader | None = None,
) -> None:
    """Run the router until SIGINT/SIGTERM (uvicorn's handlers); `on_ready(url)` once it
    listens. `snapshots`: where an embedded index cold starts from."""
    load()
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, stopping on SIGINT/SIGTERM without re-raising them afterwards
        (uvicorn would, and the command would end as killed instead of stopped)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            signals = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    app = build_app(config, snapshots=snapshots)
    server = Server(
        uvicorn.Config(
            app, host=config.host, port=config.port, log_level="warning", access_log=False
        )
    )

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            on_ready(connectable_url(unbracketed(config.host), port))
        await task

    asyncio.run(main())

"""One Starlette application shape for kvscope's services: the token check, the body limit,
JSON errors of the service's shape for 404/405/413/500 and for the handlers' refusals
(`BadInput`, a service's `Refusal`s), no slash redirects."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kvscope.schemas.errors import ConfigError
from kvscope.web.auth import BearerToken
from kvscope.web.errors import BadInput, ErrorShape, Refusal, error_response
from kvscope.web.limits import BodyLimit, body_limit_problem
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)
PUBLIC = ("/healthz",)
"""Paths served without the token: health checks come from load balancers and probes."""


def build_app(
    routes: Sequence[BaseRoute],
    *,
    service: str,
    shape: ErrorShape,
    max_body_bytes: int,
    token: str | None = None,
    public: Collection[str] = PUBLIC,
    token_param: str | None = None,
    headers: Mapping[str, str] | None = None,
    lifespan: Any = None,
) -> Starlette:
    """A Starlette app of `routes` behind the base's middleware (`ConfigError` for a body
    limit that cannot work). `service` labels the base's metrics; `token_param` names a
    query parameter that may carry the token too; `headers` go on every answer, the
    base's own refusals included."""
    problem = body_limit_problem(max_body_bytes)
    if problem:
        raise ConfigError(problem)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(shape, exc.status_code, _message(request, exc), exc.headers)

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refusal)
        return error_response(shape, exc.status, str(exc), kind=exc.kind)

    middleware = [Middleware(Crashes, shape=shape)]
    if headers:
        middleware.insert(0, Middleware(ExtraHeaders, headers=headers))
    if token:
        guard = Middleware(BearerToken, token=token, public=public, shape=shape, param=token_param)
        middleware.append(guard)
    middleware.append(Middleware(BodyLimit, limit=max_body_bytes, shape=shape, service=service))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: http_error, Refusal: refused},
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False
    return app


class Crashes:
    """ASGI middleware turning a handler's bug into a logged 500 of `shape`; the connection
    stays usable (Starlette's own handler re-raises, and uvicorn then drops it). A bug after
    the answer started is re-raised: the client must see the break-off."""

    def __init__(self, app: ASGIApp, *, shape: ErrorShape) -> None:
        self.app = app
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; answer 500 if it raises before answering."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            log.exception("unexpected error on %s", scope["path"])
            answer = error_response(self.shape, 500, f"internal error: {type(exc).__name__}")
            await answer(scope, receive, send)


class ExtraHeaders:
    """ASGI middleware adding fixed headers (security headers) to every answer."""

    def __init__(self, app: ASGIApp, *, headers: Mapping[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app, adding the headers to its answer's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *self.headers]}
            await send(message)

        await self.app(scope, receive, sending)


def _message(request: Request, exc: HTTPException) -> str:
    """`BadInput` (the base's and the handlers' refusals) says what to do; Starlette's own
    404 and 405 name the path, a 405 the methods the path takes."""
    if isinstance(exc, BadInput) or exc.status_code not in (404, 405):
        return str(exc.detail)
    allowed = sorted(filter(None, (exc.headers or {}).get("Allow", "").split(", ")))
    hint = f" (it takes {', '.join(allowed)})" if allowed else ""
    return f"{request.method} {request.url.path}: {exc.detail}{hint}"

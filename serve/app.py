"""The serve's HTTP side on the HTTP base (`kvscope.web`): routes, token, static files.

Routes (GET, and HEAD for its headers alone; every other method gets a JSON 405; all
read-only):
- `/` and `/static/NAME`: the live dashboard (its JS/CSS ship in this package, no CDN);
- `/api/queries`, `/api/query/NAME?K=V...`, `/api/collector`, `/api/index/snapshot`: JSON
  (the snapshot Arrow IPC);
- `/report?since=&until=&model=&format=html|json`: the capacity-planning report;
- `/metrics`: the collector's Prometheus metrics; `/healthz`: `{"ok": true}` while the serve
  answers, the only route answered without the token.

The base binds, checks the token (`Authorization: Bearer TOKEN`, or `?token=TOKEN`, which
the dashboard passes on to its own requests), refuses bodies (nothing here reads one) and
answers every error as one line of JSON `{"error": ...}`. Query parameters are read
strictly: each given once, none longer than `kvscope.web.limits.MAX_QUERY_TEXT`. The
endpoints are synchronous (ClickHouse calls): Starlette runs them in its thread pool.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Callable

from kvscope.schemas.errors import ConfigError
from kvscope.serve.api import Answer, ServeApi
from kvscope.web.app import build_app
from kvscope.web.errors import BadInput, plain_shape
from kvscope.web.health import Readiness, health_routes
from kvscope.web.limits import query_params
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

TOKEN_PARAM = "token"
"""The query parameter that may carry the token (the dashboard's links)."""
MAX_BODY_BYTES = 1 << 16
"""Every route is GET: a body is never read, and a large one is refused unread."""
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Sent with every answer. Inline styles are allowed: the report's HTML and the chart
library set them; scripts only come from this server."""
Endpoint = Callable[[Request, dict[str, str]], Answer]
"""What a route answers from the request and its strictly read query parameters."""


def static_file(name: str) -> Answer | None:
    """A file of the packaged dashboard (`static/NAME`), or None when there is no such file."""
    folder = importlib.resources.files("kvscope.serve").joinpath("static")
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        return None
    entry = folder.joinpath(name)
    if not entry.is_file():
        return None
    return Answer(200, STATIC_TYPES[suffix], entry.read_bytes())


def _page(name: str) -> Answer:
    answer = static_file(name)
    if answer is None:
        raise BadInput(404, f"no dashboard file {name[:80]!r}; the dashboard is at /")
    return answer


def _answering(endpoint: Endpoint) -> Callable[[Request], Response]:
    """A synchronous Starlette endpoint (run in the thread pool) answering `endpoint`'s
    `Answer`; a `ConfigError` (a parameter that does not read) is a 400."""

    def run(request: Request) -> Response:
        params = query_params(request.query_params, ignore=(TOKEN_PARAM,))
        try:
            answer = endpoint(request, params)
        except ConfigError as exc:
            raise BadInput(400, str(exc)) from None
        return Response(answer.body, answer.status, media_type=answer.content_type)

    return run


def build_serve_app(api: ServeApi, token: str | None) -> Starlette:
    """The serve's app over `api` (see the module docstring); `token` None: no check."""
    pages: dict[str, Endpoint] = {
        "/": lambda request, params: _page("index.html"),
        "/index.html": lambda request, params: _page("index.html"),
        "/static/{name}": lambda request, params: _page(request.path_params["name"]),
        "/api/queries": lambda request, params: api.list_queries(),
        "/api/query/{name}": lambda request, params: api.run_query(
            request.path_params["name"], params
        ),
        "/api/collector": lambda request, params: api.collector_status(),
        "/api/index/snapshot": lambda request, params: api.index_snapshot(params),
        "/report": lambda request, params: api.report(params),
    }
    routes = [Route(path, _answering(page), methods=["GET"]) for path, page in pages.items()]
    return build_app(
        [*routes, *health_routes(_alive)],
        service="serve",
        shape=plain_shape,
        max_body_bytes=MAX_BODY_BYTES,
        token=token,
        token_param=TOKEN_PARAM,
        headers=SECURITY_HEADERS,
    )


def _alive() -> Readiness:
    """The serve answers while it runs: its collector's troubles are on /api/collector."""
    return Readiness(True, {"ok": True})

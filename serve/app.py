"""The serve's HTTP listener: routes, token check, static dashboard files (standard library only).

Routes (GET, and HEAD for its headers alone; every other method gets a 405; all read-only):
- `/` and `/static/NAME`: the live dashboard (its JS/CSS ship in this package, no CDN);
- `/api/queries`, `/api/query/NAME?K=V...`, `/api/collector`: JSON;
- `/report?since=&until=&model=&format=html|json`: the capacity-planning report;
- `/metrics`: the collector's Prometheus metrics; `/healthz`: liveness, the only route
  answered without the token.

With a token, every other request needs `Authorization: Bearer TOKEN` (or `?token=TOKEN`,
which the dashboard passes on to its own requests); the comparison is constant-time.
"""

from __future__ import annotations

import hmac
import importlib.resources
import logging
import socket
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kvscope.schemas.errors import ConfigError
from kvscope.serve.api import Answer, ServeApi, error_answer

log = logging.getLogger(__name__)

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


class _Handler(BaseHTTPRequestHandler):
    """One request: authenticate, route to `ServeApi`, answer."""

    server: ServeHTTPServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        params = dict(pairs)
        token = params.pop("token", None)
        if parts.path == "/healthz":
            self._send(Answer(200, "text/plain; charset=utf-8", b"ok\n"))
            return
        if not self.server.authorized(self.headers.get("Authorization"), token):
            self._send(error_answer("missing or wrong token (Authorization: Bearer ...)", 401))
            return
        repeated = sorted(name for name, count in Counter(k for k, _ in pairs).items() if count > 1)
        try:
            if repeated:
                raise ConfigError(f"{', '.join(repeated)} given more than once: give each once")
            answer = self._route(parts.path, params)
        except ConfigError as exc:
            answer = error_answer(str(exc))
        except Exception as exc:  # one line to the client; details in the serve's log
            log.exception("request %s failed", parts.path)
            answer = error_answer(f"internal error: {type(exc).__name__}: {exc}", 500)
        self._send(answer)

    def _route(self, path: str, params: dict[str, str]) -> Answer:
        api = self.server.api
        if path in ("/", "/index.html"):
            return static_file("index.html") or error_answer("dashboard missing", 500)
        if path.startswith("/static/"):
            return static_file(path.removeprefix("/static/")) or error_answer("not found", 404)
        if path == "/api/queries":
            return api.list_queries()
        if path.startswith("/api/query/"):
            return api.run_query(unquote(path.removeprefix("/api/query/")), params)
        if path == "/api/collector":
            return api.collector_status()
        if path == "/api/index/snapshot":
            return api.index_snapshot(params)
        if path == "/report":
            return api.report(params)
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return Answer(200, CONTENT_TYPE_LATEST, generate_latest())
        return error_answer(f"no such page {path!r}; see /api/queries", 404)

    def do_POST(self) -> None:
        self._send(error_answer("read-only: only GET is served", 405))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST
    do_HEAD = do_GET

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Debug-log method, path and status only: the query string may carry ?token=."""
        log.debug("%s %s -> %s", self.command, self._logged_path(), code)

    def log_error(self, format: str, *args: Any) -> None:
        """Debug-log a refused request's status only: the message can quote the raw request
        line, token and all."""
        log.debug("%s %s -> %s", self.command, self._logged_path(), args[0] if args else "?")

    def _logged_path(self) -> str:
        # A request line that could not be read (bad syntax, too long) set no path.
        return urlsplit(getattr(self, "path", "")).path


class ServeHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server bound to one `ServeApi` and an optional token."""

    daemon_threads = True

    def __init__(self, host: str, port: int, api: ServeApi, token: str | None) -> None:
        """Bind `host:port` (IPv4 or IPv6: the family is the host's); OSError if it cannot."""
        self.api = api
        self._token = token.encode() if token else None
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), _Handler)

    def authorized(self, header: str | None, query_token: str | None) -> bool:
        """True without a configured token, else when the request carries it."""
        if self._token is None:
            return True
        given = query_token or ""
        if header and header.lower().startswith("bearer "):
            given = header[7:].strip()
        return hmac.compare_digest(given.encode(), self._token)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is routine (debug log); anything else is logged."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("client %s went away before the answer was sent", client_address)
            return
        log.exception("request from %s failed", client_address)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.server_address[1])

    def start_background(self) -> threading.Thread:
        """Serve in a daemon thread; `shutdown()` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="kvscope-serve-http", daemon=True)
        thread.start()
        return thread

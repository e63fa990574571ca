"""The bearer-token check as ASGI middleware: every path but the public ones (`/healthz`)
needs `Authorization: Bearer TOKEN` (the scheme in any case, RFC 9110), or, where a service
allows it (the serve's dashboard, opened from a link), the token as a query parameter;
compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Collection
from urllib.parse import parse_qsl

from kvscope.web.errors import ErrorShape, error_response
from starlette.types import ASGIApp, Receive, Scope, Send


def authorized(header: bytes, token: bytes) -> bool:
    """True when the Authorization header value carries `token` as a bearer token."""
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


class BearerToken:
    """ASGI middleware answering 401 of `shape` to requests without the token."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        public: Collection[str],
        shape: ErrorShape,
        param: str | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode()
        self.public = frozenset(public)
        self.shape = shape
        self.param = param

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass public paths and requests with the token; answer 401 to the rest."""
        if scope["type"] == "http" and scope["path"] not in self.public:
            header = dict(scope["headers"]).get(b"authorization", b"")
            if not authorized(header, self.token) and not self._in_query(scope):
                answer = error_response(self.shape, 401, "missing or wrong bearer token")
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _in_query(self, scope: Scope) -> bool:
        """True when the query parameter `param` (if allowed) carries the token."""
        if self.param is None:
            return False
        pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        given = [value.encode("latin-1", "replace") for name, value in pairs if name == self.param]
        return len(given) == 1 and hmac.compare_digest(given[0], self.token)

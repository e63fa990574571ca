"""The bearer-token check as ASGI middleware: every path but the public ones (`/healthz`)
needs `Authorization: Bearer TOKEN` (the scheme in any case, RFC 9110), compared in
constant time."""

from __future__ import annotations

import hmac
from collections.abc import Collection

from kvscope.web.errors import ErrorShape, error_response
from starlette.types import ASGIApp, Receive, Scope, Send


def authorized(header: bytes, token: bytes) -> bool:
    """True when the Authorization header value carries `token` as a bearer token."""
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


class BearerToken:
    """ASGI middleware answering 401 of `shape` to requests without the token."""

    def __init__(
        self, app: ASGIApp, *, token: str, public: Collection[str], shape: ErrorShape
    ) -> None:
        self.app = app
        self.token = token.encode()
        self.public = frozenset(public)
        self.shape = shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass public paths and requests with the token; answer 401 to the rest."""
        if scope["type"] == "http" and scope["path"] not in self.public:
            header = dict(scope["headers"]).get(b"authorization", b"")
            if not authorized(header, self.token):
                answer = error_response(self.shape, 401, "missing or wrong bearer token")
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""The router's errors: each carries the HTTP status and OpenAI error `type` it answers with,
so a client always gets a JSON error, never a traceback (the HTTP base answers every
`Refusal` a handler raises, `kvscope.web.errors`)."""

from __future__ import annotations

from kvscope.schemas.errors import KvscopeError
from kvscope.web.errors import Refusal


class RouteError(KvscopeError, Refusal):
    """A request the router cannot serve; `status` and `kind` go into the JSON answer."""

    status: int = 500
    kind: str = "internal_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class BadRequest(RouteError):
    """The client's request is malformed (not JSON, no prompt, wrong types)."""

    status = 400
    kind = "invalid_request_error"


class IndexUnavailable(RouteError):
    """The index did not answer (unreachable or failing); the router routes by load."""

    status = 503
    kind = "index_unavailable"
    retriable = True


class IndexRefused(IndexUnavailable):
    """The index refused the router's token (`--index-token`)."""


class NoEngineUp(RouteError):
    """Every engine is down."""

    status = 503
    kind = "no_engine_available"
    retriable = True


class TokenizeFailed(KvscopeError):
    """An engine's `/tokenize` failed or was slow: the request is routed by load, and the
    engine stays in rotation (it may serve completions fine)."""

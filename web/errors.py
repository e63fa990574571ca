"""JSON error answers in the shape of the service that gives them.

The router answers OpenAI's `{"error": {"message", "type", "code"}}`, the index
`{"error": "..."}`: the base is handed the shape as a function and uses it for every
error answer, its own (401, 404, 405, 413, 400, 500) and the handlers' (`BadInput`,
`Refusal`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.responses import Response

ErrorShape = Callable[[int, str, str | None], Mapping[str, Any]]
"""(status, one-line message, the error's type or None) -> the JSON body of an error
answer. The type comes from a `Refusal` that names one; a shape that has a type field
chooses it from the status otherwise."""


class BadInput(HTTPException):
    """A request the base refuses (too large, not JSON, a bad query parameter): a 4xx whose
    message says what to send instead. `close` asks the server to drop the connection
    (the rest of a refused body is never read)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(status, message, {"connection": "close"} if close else None)


class Refusal(Exception):
    """An error of a service's own domain that refuses a request (the router's
    `RouteError`): raised by a handler, answered by the base with `status` and `kind` in
    the service's shape, as `BadInput` is."""

    status: int = 500
    kind: str | None = None
    """The error's type for shapes that name one (None: the shape's choice)."""


def plain_shape(status: int, message: str, kind: str | None = None) -> Mapping[str, Any]:
    """The index's shape: `{"error": message}`."""
    return {"error": message}


def error_response(
    shape: ErrorShape,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    kind: str | None = None,
) -> Response:
    """A JSON error answer of `shape` (the message flattened to one line)."""
    body = msgspec.json.encode(shape(status, " ".join(message.split()), kind))
    return Response(body, status, headers=dict(headers or {}), media_type="application/json")

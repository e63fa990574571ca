"""JSON error answers in the shape of the service that gives them.

The router answers OpenAI's `{"error": {"message", "type", "code"}}`, the index
`{"error": "..."}`: the base is handed the shape as a function and uses it for every
answer it writes itself (401, 404, 405, 413, 400, 500).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.responses import Response

ErrorShape = Callable[[int, str], Mapping[str, Any]]
"""(status, one-line message) -> the JSON body of an error answer."""


class BadInput(HTTPException):
    """A request the base refuses (too large, not JSON, a bad query parameter): a 4xx whose
    message says what to send instead. `close` asks the server to drop the connection
    (the rest of a refused body is never read)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(status, message, {"connection": "close"} if close else None)


def plain_shape(status: int, message: str) -> Mapping[str, Any]:
    """The index's shape: `{"error": message}`."""
    return {"error": message}


def error_response(
    shape: ErrorShape, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON error answer of `shape` (the message flattened to one line)."""
    body = msgspec.json.encode(shape(status, " ".join(message.split())))
    return Response(body, status, headers=dict(headers or {}), media_type="application/json")

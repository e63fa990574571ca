"""Request limits enforced while reading: body bytes (ASGI middleware), JSON nesting and
UTF-8, query parameters. Every refusal is a `BadInput` 4xx, never a 500.

A declared Content-Length over the limit is refused before any body byte is read; an
undeclared (chunked) body is counted as it arrives and refused the moment it passes the
limit, so memory is bounded by the limit, not by what the client sends.
"""

from __future__ import annotations

import asyncio
import re
from array import array
from collections.abc import Collection
from itertools import accumulate
from typing import TypeVar

import msgspec
from kvscope.common.metrics import counter
from kvscope.web.errors import BadInput, ErrorShape, error_response
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_JSON_DEPTH = 64
"""Deepest JSON nesting a request body may have (kvscope's requests need 3)."""
MAX_DIGITS = 18
"""Longest integer a query parameter may spell (below 2**63)."""
MAX_QUERY_TEXT = 1024
"""Longest text a query parameter may hold."""
BODY_BYTES = counter(
    "kvscope_http_body_bytes_read",
    "Request body bytes the HTTP base let through to the handlers, by service",
    ["service"],
)
REFUSED = counter(
    "kvscope_http_refused_requests",
    "Requests refused by the HTTP base's limits, by service and reason",
    ["service", "reason"],
)
_DIGITS = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
"""Brackets to signed steps: openers +1, closers -1 (0xff read as a signed byte)."""
_SLICE = 1 << 16
_INLINE_CHECK = 1 << 18
"""Bodies up to this size are checked on the event loop (well under a millisecond)."""
T = TypeVar("T")


def body_limit_problem(limit: int) -> str | None:
    """Why `limit` cannot be a body limit (None when it can)."""
    if 1024 <= limit <= 1 << 30:
        return None
    return f"--max-body-bytes must be 1024..{1 << 30}, got {limit}"


class BodyLimit:
    """ASGI middleware refusing request bodies over `limit` bytes with a 413 of `shape`."""

    def __init__(self, app: ASGIApp, *, limit: int, shape: ErrorShape, service: str) -> None:
        self.app = app
        self.limit = limit
        self.shape = shape
        self.read = BODY_BYTES.labels(service)
        self.refused = REFUSED.labels(service, "body_size")
        self.message = f"request body over {limit} bytes (--max-body-bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared oversize body at once; count an undeclared one while read."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            self.refused.inc()
            answer = error_response(self.shape, 413, self.message, {"connection": "close"})
            await answer(scope, receive, send)
            return
        total = 0

        async def counted() -> Message:
            nonlocal total
            message = await receive()
            chunk = len(message.get("body", b""))
            total += chunk
            if total > self.limit:
                self.refused.inc()
                raise BadInput(413, self.message, close=True)
            self.read.inc(chunk)
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body length; past any limit when it is not a plain number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if _DIGITS.fullmatch(value.decode("latin-1")) else 1 << 62
    return None


def nesting_problem(raw: bytes, depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why the JSON text `raw` cannot be decoded safely: it nests arrays/objects deeper than
    `depth` (None when it does not).

    Escapes and strings are cut out and the brackets left become +1/-1 steps whose running
    sum is the depth, a slice at a time in C-level loops, stopping at the first slice past
    `depth`.
    Unbalanced brackets are the decoder's to refuse: it stops at the first stray closer,
    and no opener before it is deeper than `depth`.
    """
    if raw.count(b"[") + raw.count(b"{") <= depth:
        return None
    # `\\` first: what is left of `\"` is then an escaped quote, not a string's end.
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    steps = array("b", b"".join(text.split(b'"')[::2]).translate(_STEP))
    level = 0
    for start in range(0, len(steps), _SLICE):
        part = steps[start : start + _SLICE]
        if max(accumulate(part, initial=level)) > depth:
            return f"the body's JSON nests deeper than {depth} levels"
        level += sum(part)
    return None


def check_json(raw: bytes, depth: int = MAX_JSON_DEPTH) -> None:
    """`BadInput` 400 when `raw` is not UTF-8 or nests deeper than `depth` (cheap checks a
    handler runs before its own decoding)."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(400, f"the body is not UTF-8 (byte {exc.start})") from None
    problem = nesting_problem(raw, depth)
    if problem:
        raise BadInput(400, problem)


async def read_json_body(request: Request, depth: int = MAX_JSON_DEPTH) -> bytes:
    """The request's body (the body limit applies while it is read), checked by
    `check_json`; a large one is checked off the event loop, which keeps answering."""
    raw = await request.body()
    if len(raw) > _INLINE_CHECK:
        await asyncio.to_thread(check_json, raw, depth)
    else:
        check_json(raw, depth)
    return raw


def decode_json(raw: bytes, kind: type[T]) -> T:
    """A body `check_json` passed, decoded as `kind`; `BadInput` 400 naming what is wrong."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise BadInput(400, f"bad request body: {exc}") from None
    except msgspec.DecodeError:
        raise BadInput(400, "the body is not JSON") from None


def parse_int(text: str, name: str, low: int, high: int) -> int:
    """`text` as an integer low..high: ASCII digits only (no sign, no `²`, no 5000-digit
    numbers); `BadInput` 400 otherwise."""
    if _DIGITS.fullmatch(text) and low <= int(text) <= high:
        return int(text)
    raise BadInput(400, f"{name} must be an integer {low}..{high}, got {text[:40]!r}")


def query_int(params: QueryParams, name: str, default: int, low: int, high: int) -> int:
    """Query parameter `name` parsed by `parse_int` (`default` when absent)."""
    text = params.get(name)
    return default if text is None else parse_int(text, name, low, high)


def query_params(params: QueryParams, ignore: Collection[str] = ()) -> dict[str, str]:
    """Every query parameter but `ignore`, each given once and at most `MAX_QUERY_TEXT`
    characters long; `BadInput` 400 naming the ones that are not."""
    names = [name for name in params if name not in ignore]
    repeated = sorted({name for name in names if len(params.getlist(name)) > 1})
    if repeated:
        raise BadInput(400, f"{', '.join(repeated)} given more than once: give each once")
    for name in names:
        query_text(params, name)
    return {name: params[name] for name in names}


def query_text(params: QueryParams, name: str, default: str = "") -> str:
    """Query parameter `name` as text of at most `MAX_QUERY_TEXT` characters."""
    text = params.get(name, default)
    if len(text) > MAX_QUERY_TEXT:
        raise BadInput(400, f"{name} is longer than {MAX_QUERY_TEXT} characters")
    return text

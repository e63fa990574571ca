"""The index's HTTP API (Starlette): /score, /routed, /sources, /resident, /healthz, /metrics.

Handlers run on the event loop that also applies Kafka records, so every answer sees one
consistent state without locks. Bad input gets a 4xx JSON `{"error": ...}` naming what is
wrong (404, 405, 413 and 500 too); every route but /healthz needs the bearer token when one
is configured. The body limit, token check and strict parsing are the HTTP base's
(`kvscope.web`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import msgspec
from kvscope.index import metrics
from kvscope.index.config import DEFAULT_MAX_REQUEST_TOKENS
from kvscope.index.errors import IndexConfigError
from kvscope.index.hashing import BlockHasher
from kvscope.index.health import FeedStatus
from kvscope.index.protocol import RoutedRequest, ScoreRequest, ScoreResult
from kvscope.index.state import PrefixIndex
from kvscope.web.app import build_app
from kvscope.web.errors import BadInput, plain_shape
from kvscope.web.health import Readiness, health_routes
from kvscope.web.limits import decode_json, query_int, query_text, read_json_body
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

MAX_LIST_LIMIT = 100_000
"""Largest page of `/resident`."""
_U64_MAX = 2**64 - 1
_CURSOR = re.compile(r"([0-9]{1,18})\.([0-9]{1,18})")


def _json(payload: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status, media_type="application/json")


class IndexApi:
    """The routes over one `PrefixIndex` (and whether its feed has caught up)."""

    def __init__(
        self,
        index: PrefixIndex,
        hasher: BlockHasher,
        *,
        token: str | None = None,
        routed_ttl_s: float = 2.0,
        status: Callable[[], FeedStatus] = FeedStatus,
        max_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
        max_body_bytes: int = 16 << 20,
    ) -> None:
        self.index = index
        self.hasher = hasher
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.routed_ttl_s = routed_ttl_s
        self.status = status
        self.max_tokens = max_tokens

    def app(self) -> Starlette:
        """The Starlette application."""
        routes = [
            *health_routes(self.readiness, refresh=self.refresh_metrics),
            Route("/sources", self.sources),
            Route("/sources/{instance}", self.forget, methods=["DELETE"]),
            Route("/resident", self.resident),
            Route("/score", self.score, methods=["POST"]),
            Route("/routed", self.routed, methods=["POST"]),
        ]
        return build_app(
            routes,
            service="index",
            shape=plain_shape,
            max_body_bytes=self.max_body_bytes,
            token=self.token,
        )

    def readiness(self) -> Readiness:
        """Ready only while the feed reads Kafka and has caught up with the topic's end; the
        body has the reason, the connection state, since when and the last error."""
        status = self.status()
        return Readiness(status.ready, status.as_json())

    def refresh_metrics(self) -> None:
        """Bring the state's gauges up to date (before /metrics answers)."""
        infos = self.index.sources()
        metrics.SOURCES.set(len(infos))
        metrics.STALE_SOURCES.set(sum(info.stale for info in infos))
        metrics.LAG_SECONDS.set(self.index.lag_s())
        metrics.RESIDENT_HASHES.set(self.index.table.hashes)
        metrics.TABLE_BYTES.set(self.index.table.nbytes())
        metrics.CAUGHT_UP.set(int(self.status().caught_up))

    async def sources(self, request: Request) -> Response:
        """Every source: instance, dp_rank, epoch, resident, stale, lag_s (and details); the
        feed's state in the `X-Kvscope-Feed` header (the body stays a list)."""
        rows = [_source_row(info) for info in self.index.sources()]
        answer = _json(rows)
        answer.headers["X-Kvscope-Feed"] = msgspec.json.encode(self.status().as_json()).decode()
        return answer

    async def forget(self, request: Request) -> Response:
        """DELETE /sources/{instance}[?dp_rank=D]: drop the source (every rank without
        dp_rank) and reuse its memory; 404 when the index holds no such source."""
        instance = request.path_params["instance"]
        given = request.query_params.get("dp_rank")
        dp_rank = None if given is None else query_int(request.query_params, "dp_rank", 0, 0, 65535)
        forgotten = self.index.forget(instance, dp_rank)
        if not forgotten:
            raise BadInput(404, f"no source {instance}/{given or '*'}; GET /sources lists them")
        metrics.FORGOTTEN_SOURCES.inc(forgotten)
        return _json({"ok": True, "forgotten": forgotten})

    async def resident(self, request: Request) -> Response:
        """One page of a source's resident hashes: `{"hashes": [...], "next": cursor|null}`."""
        params = request.query_params
        instance = query_text(params, "instance")
        if not instance:
            raise BadInput(400, "instance is required: /resident?instance=I&dp_rank=D")
        dp_rank = query_int(params, "dp_rank", 0, 0, 65535)
        limit = query_int(params, "limit", 1000, 1, MAX_LIST_LIMIT)
        start = 0
        after = query_text(params, "after")
        if after:
            start = self._cursor(after)
        if self.index.source(instance, dp_rank) is None:
            raise BadInput(404, f"no source {instance}/{dp_rank}; GET /sources lists them")
        hashes, end = self.index.resident(instance, dp_rank, start=start, limit=limit)
        cursor = None if end is None else f"{self.index.table.generation}.{end}"
        return _json({"hashes": hashes, "next": cursor})

    async def score(self, request: Request) -> Response:
        """Per source: leading blocks held, tokens, tier-weighted score, staleness; the lag."""
        body = await _decode(request, ScoreRequest)
        started = time.perf_counter()
        hashes = self._hashes(body)
        result = self.index.score(hashes, model=body.model, ready=self.status().ready)
        metrics.SCORE_SECONDS.observe(time.perf_counter() - started)
        return _json(_score_payload(result, len(hashes)))

    async def routed(self, request: Request) -> Response:
        """Add short-lived hints that the request's blocks are going to a source."""
        body = await _decode(request, RoutedRequest)
        if not body.instance:
            raise BadInput(400, "instance is required: the source the request was sent to")
        hashes = self._hashes(body)
        if not self.index.add_routed(hashes, body.instance, body.dp_rank, ttl_s=self.routed_ttl_s):
            raise BadInput(
                404, f"no source {body.instance}/{body.dp_rank}; GET /sources lists them"
            )
        return _json({"ok": True, "blocks": len(hashes), "ttl_s": self.routed_ttl_s})

    def _cursor(self, after: str) -> int:
        """The position of an `after` cursor (`generation.position`) this index gave."""
        match = _CURSOR.fullmatch(after)
        if match is None:
            raise BadInput(400, f"after={after[:40]!r} is not a cursor this index gave")
        if int(match[1]) != self.index.table.generation:
            raise BadInput(409, "the index reorganized since this cursor: start again")
        return int(match[2])

    def _hashes(self, body: ScoreRequest) -> list[int]:
        given = len(body.block_hashes or ()) + len(body.token_ids or ())
        if given > self.max_tokens:
            metrics.REJECTED_REQUESTS.inc()
            raise BadInput(
                413,
                f"{given:,} ids is over this index's cap of {self.max_tokens:,} per request: "
                "send a shorter prompt (or raise --max-request-tokens)",
            )
        if body.block_hashes is not None:
            if body.token_ids is not None:
                raise BadInput(400, "give block_hashes or token_ids, not both")
            if body.block_hashes and max(body.block_hashes) > _U64_MAX:
                raise BadInput(400, "block_hashes must be unsigned 64-bit integers")
            return body.block_hashes
        if body.token_ids is None:
            raise BadInput(400, 'give "block_hashes": [...] or "token_ids": [...] with "model"')
        if not body.model:
            raise BadInput(400, '"token_ids" needs "model": its engines\' block size and hashing')
        block_size = self._block_size(body.model)
        try:
            return self.hasher.block_hashes(
                body.token_ids,
                block_size,
                lora_name=body.lora_name,
                lora_path=body.lora_path,
                cache_salt=body.cache_salt,
            )
        except IndexConfigError as exc:
            raise BadInput(400, str(exc)) from None

    def _block_size(self, model: str) -> int:
        block_size = self.index.block_size(model)
        if not block_size:
            raise BadInput(404, f"no source of model {model!r} has published blocks yet")
        return block_size


async def _decode(request: Request, kind: type[ScoreRequest]) -> Any:
    """The body as `kind`, refused past the body limit while read, too deep, or not UTF-8."""
    return decode_json(await read_json_body(request), kind)


def _source_row(info: Any) -> dict[str, Any]:
    return {
        "instance": info.instance,
        "dp_rank": info.dp_rank,
        "epoch": info.epoch,
        "resident": info.resident,
        "stale": info.stale,
        "lag_s": round(info.lag_s, 6),
        "model": info.model,
        "block_size": info.block_size,
        "stale_reason": info.stale_reason,
        "tiers": info.tiers,
    }


def _score_payload(result: ScoreResult, blocks: int) -> dict[str, Any]:
    """The /score answer; the sources' Structs encode as objects with their field names."""
    return {
        "lag_s": round(result.lag_s, 6),
        "blocks": blocks,
        "sources": result.sources,
        "ready": result.ready,
    }

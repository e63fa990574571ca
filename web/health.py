"""`/healthz` and `/metrics` answered the same way by every service on the base.

Each service passes in a readiness callable: `/healthz` answers 200 only when it says ready,
503 otherwise, with its JSON body (the service's own fields: why it is or is not ready).
`/metrics` is the service's Prometheus registry, after an optional `refresh` that brings
gauges read from live state up to date.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


@dataclasses.dataclass(frozen=True)
class Readiness:
    """Whether a service can do its job now, and the JSON body `/healthz` answers with."""

    ready: bool
    """True: `/healthz` answers 200; False: 503."""
    body: Mapping[str, Any]
    """The service's own fields (outside scripts read them): state, reasons, since when."""


def health_routes(
    readiness: Callable[[], Readiness],
    *,
    registry: CollectorRegistry = REGISTRY,
    refresh: Callable[[], None] | None = None,
) -> list[Route]:
    """`GET /healthz` from `readiness` and `GET /metrics` from `registry` (after `refresh`).
    `/healthz` is public by the base's default; `/metrics` needs the token when one is set."""

    async def healthz(request: Request) -> Response:
        state = readiness()
        body = msgspec.json.encode(state.body)
        return Response(body, 200 if state.ready else 503, media_type="application/json")

    async def metrics(request: Request) -> Response:
        if refresh is not None:
            refresh()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

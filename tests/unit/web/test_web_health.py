"""`/healthz` and `/metrics` of the HTTP base over a real uvicorn on 127.0.0.1: the status
follows the readiness callable, the body is its JSON, /metrics is the service's own
registry after its refresh, and only /metrics needs the token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kvscope.web.app import build_app
from kvscope.web.errors import plain_shape
from kvscope.web.health import Readiness, health_routes
from prometheus_client import CollectorRegistry, Gauge
from support.live_http import live

TOKEN = "health-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Service:
    """A service's live state: what its readiness callable and metrics refresh read."""

    def __init__(self) -> None:
        self.ready = False
        self.reason: str | None = "starting"
        self.refreshes = 0
        self.registry = CollectorRegistry()
        self.gauge = Gauge("svc_things", "Things held", registry=self.registry)

    def readiness(self) -> Readiness:
        """Ready as set; the body carries the service's own fields."""
        return Readiness(self.ready, {"ok": self.ready, "reason": self.reason, "n": [1, 2]})

    def refresh(self) -> None:
        """Count the refreshes; the gauge shows how many."""
        self.refreshes += 1
        self.gauge.set(self.refreshes)


@pytest.fixture(scope="module")
def service() -> Service:
    return Service()


@pytest.fixture(scope="module")
def url(service: Service) -> Iterator[str]:
    routes = health_routes(service.readiness, registry=service.registry, refresh=service.refresh)
    app = build_app(routes, service="health", shape=plain_shape, max_body_bytes=4096, token=TOKEN)
    with live(app) as base:
        yield base


@pytest.mark.parametrize(
    ("ready", "reason", "status"), [(False, "starting", 503), (True, None, 200), (False, "x", 503)]
)
def test_healthz_follows_readiness(
    url: str, service: Service, ready: bool, reason: str | None, status: int
) -> None:
    service.ready, service.reason = ready, reason
    answer = httpx.get(f"{url}/healthz")  # no token: probes and load balancers
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"ok": ready, "reason": reason, "n": [1, 2]}


def test_metrics_are_the_services_registry_after_its_refresh(url: str, service: Service) -> None:
    assert httpx.get(f"{url}/metrics").status_code == 401
    for expected in range(service.refreshes + 1, service.refreshes + 4):
        text = httpx.get(f"{url}/metrics", headers=AUTH).text
        assert f"svc_things {float(expected)}" in text
    assert "kvscope_http_body_bytes_read" not in text  # the default registry is not mixed in


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
@pytest.mark.parametrize("method", ["POST", "DELETE"])
def test_other_methods_are_a_json_405_naming_the_ones_taken(
    url: str, path: str, method: str
) -> None:
    answer: Any = httpx.request(method, f"{url}{path}", headers=AUTH)
    assert answer.status_code == 405
    assert answer.json() == {"error": f"{method} {path}: Method Not Allowed (it takes GET, HEAD)"}

"""The collector's HTTP listener on a real socket: /healthz follows the consume loop's
polls (a controlled clock decides when they are too old), /metrics serves the registry."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from kvscope.collector.pipeline import metrics


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _serve(liveness: metrics.Liveness) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    metrics.serve(free, liveness=liveness)
    return free


@pytest.mark.parametrize("max_age_s", [1.0, 120.0])
def test_healthz_is_503_after_max_age_without_a_poll_and_200_after_one(max_age_s: float) -> None:
    clock = Clock()
    liveness = metrics.Liveness(max_age_s, clock=clock)
    port = _serve(liveness)
    assert _get(port, "/healthz") == (200, b"ok\n")  # fresh right after start
    clock.now += max_age_s
    assert _get(port, "/healthz")[0] == 200
    clock.now += max_age_s / 10
    assert _get(port, "/healthz") == (503, b"consume loop stalled\n")
    liveness.beat()
    assert _get(port, "/healthz") == (200, b"ok\n")


def test_metrics_path_serves_the_collector_metrics() -> None:
    port = _serve(metrics.Liveness())
    metrics.COMMITS.inc()
    status, body = _get(port, "/metrics")
    assert status == 200
    names = {line.split(" ")[0] for line in body.decode().splitlines() if line[:1] != "#"}
    assert {"kvscope_collector_commits_total", "kvscope_collector_paused_partitions"} <= names

"""The bridge's Prometheus metrics (default registry), served by `kvscope bridge --prometheus-port`.

Per endpoint: batches forwarded, engine batches reported lost (by reason), replay requests
(by result) and the batches replays returned. Next to them the same registry holds the
Kafka publisher's own metrics (published, dropped, queue depth, send latency).
"""

from __future__ import annotations

from kvscope.publisher.metrics import existing_or
from prometheus_client import Counter


def _counter(name: str, documentation: str, labels: list[str]) -> Counter:
    counter = existing_or(name, lambda: Counter(name, documentation, labels))
    assert isinstance(counter, Counter)
    return counter


FORWARDED = _counter(
    "kvscope_bridge_forwarded_batches",
    "Engine KV-event batches the bridge forwarded to Kafka",
    ["endpoint"],
)
LOST = _counter(
    "kvscope_bridge_lost_batches",
    "Engine KV-event batches the bridge could not recover and reported in a Gap",
    ["endpoint", "reason"],
)
REPLAYS = _counter(
    "kvscope_bridge_replays",
    "Replay requests to engines' replay sockets, by result (ok, timeout, error)",
    ["endpoint", "result"],
)
REPLAYED = _counter(
    "kvscope_bridge_replayed_batches",
    "Batches engines' replay sockets returned",
    ["endpoint"],
)

"""The publisher's Prometheus metrics, registered once per process in the default registry.

They show on the engine's own `/metrics` (vLLM serves the default registry). Several
`KafkaPublisher` instances in one process share these collectors; queue depth sums them.
They are declared with `kvscope.common.metrics`, like every kvscope metric.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

from kvscope.common.metrics import counter, gauge, histogram
from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)


class _HasDepth(Protocol):
    def queue_depth(self) -> int: ...

    def queue_capacity(self) -> int: ...


@dataclass(frozen=True)
class PublisherMetrics:
    """The collectors; labels: stream, reason (drops), kind (errors)."""

    published: Counter
    dropped: Counter
    queue_depth: Gauge
    queue_capacity: Gauge
    send_latency: Histogram
    errors: Counter
    sender_restarts: Counter
    sources: weakref.WeakSet[_HasDepth]

    def note_error(self, kind: str, exc: BaseException | None = None) -> None:
        """Count an error without raising; log the first one of each kind (then only count)."""
        self.errors.labels(kind=kind).inc()
        if kind not in _logged_errors:
            _logged_errors.add(kind)
            log.warning(
                "kvscope publisher error (%s): %s; further ones are only counted",
                kind,
                repr(exc)[:200] if exc is not None else "see traceback",
                exc_info=exc is None,
            )


_logged_errors: set[str] = set()


_SEND_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_lock = threading.Lock()
_metrics: PublisherMetrics | None = None


def reset_metric_locks() -> None:
    """After a fork, in the child: fresh locks in the publisher's metrics.

    A lock another thread held at the fork (the sender counting a delivery) would stay
    held in the child, and the child's next count would hang. prometheus_client keeps
    one lock per collector and one per value; both are replaced here.
    """
    global _lock
    _lock = threading.Lock()
    metrics = _metrics
    if metrics is None:
        return
    for collector in (
        metrics.published,
        metrics.dropped,
        metrics.queue_depth,
        metrics.send_latency,
        metrics.errors,
        metrics.sender_restarts,
    ):
        for metric in (collector, *getattr(collector, "_metrics", {}).values()):
            values = [getattr(metric, "_value", None), getattr(metric, "_sum", None)]
            for value in (metric, *values, *getattr(metric, "_buckets", ())):
                if value is not None and hasattr(value, "_lock"):
                    value._lock = threading.Lock()


def publisher_metrics() -> PublisherMetrics:
    """The process-wide collectors, created on first use."""
    global _metrics
    with _lock:
        if _metrics is None:
            sources: weakref.WeakSet[_HasDepth] = weakref.WeakSet()
            depth = gauge(
                "kvscope_publisher_queue_depth",
                "Records waiting in kvscope publisher queues of this process",
            )
            depth.set_function(lambda: sum(s.queue_depth() for s in list(sources)))
            capacity = gauge(
                "kvscope_publisher_queue_capacity",
                "Records kvscope publisher queues of this process can hold (queue_size each)",
            )
            capacity.set_function(lambda: sum(s.queue_capacity() for s in list(sources)))
            _metrics = PublisherMetrics(
                published=counter(
                    "kvscope_publisher_published",
                    "Records acknowledged by Kafka",
                    ("stream",),
                ),
                dropped=counter(
                    "kvscope_publisher_dropped",
                    "Records lost before reaching Kafka (each also reported in a Gap)",
                    ("stream", "reason"),
                ),
                queue_depth=depth,
                queue_capacity=capacity,
                send_latency=histogram(
                    "kvscope_publisher_send_latency_seconds",
                    "Time from publish() to the broker's acknowledgement, per record batch",
                    buckets=_SEND_LATENCY_BUCKETS,
                ),
                errors=counter(
                    "kvscope_publisher_errors",
                    "Errors inside the publisher (connect, send, encode)",
                    ("kind",),
                ),
                sender_restarts=counter(
                    "kvscope_publisher_sender_restarts",
                    "Times a sender loop or thread was found dead and started again",
                ),
                sources=sources,
            )
        return _metrics

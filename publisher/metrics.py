"""The publisher's Prometheus metrics, registered once per process in the default registry.

They show on the engine's own `/metrics` (vLLM serves the default registry). Several
`KafkaPublisher` instances in one process share these collectors; queue depth sums them.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

log = logging.getLogger(__name__)


class _HasDepth(Protocol):
    def queue_depth(self) -> int: ...


@dataclass(frozen=True)
class PublisherMetrics:
    """The collectors; labels: stream, reason (drops), kind (errors)."""

    published: Counter
    dropped: Counter
    queue_depth: Gauge
    send_latency: Histogram
    errors: Counter
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


_lock = threading.Lock()
_metrics: PublisherMetrics | None = None


def existing_or(name: str, make: Callable[[], object]) -> object:
    """Reuse a collector already in the default registry (e.g. after a module reload)."""
    collector = REGISTRY._names_to_collectors.get(name)
    return collector if collector is not None else make()


def publisher_metrics() -> PublisherMetrics:
    """The process-wide collectors, created on first use."""
    global _metrics
    with _lock:
        if _metrics is None:
            sources: weakref.WeakSet[_HasDepth] = weakref.WeakSet()
            depth = existing_or(
                "kvscope_publisher_queue_depth",
                lambda: Gauge(
                    "kvscope_publisher_queue_depth",
                    "Records waiting in kvscope publisher queues of this process",
                ),
            )
            assert isinstance(depth, Gauge)
            depth.set_function(lambda: sum(s.queue_depth() for s in list(sources)))
            _metrics = PublisherMetrics(
                published=_counter(
                    "kvscope_publisher_published",
                    "Records acknowledged by Kafka",
                    ("stream",),
                ),
                dropped=_counter(
                    "kvscope_publisher_dropped",
                    "Records lost before reaching Kafka (each also reported in a Gap)",
                    ("stream", "reason"),
                ),
                queue_depth=depth,
                send_latency=_histogram(),
                errors=_counter(
                    "kvscope_publisher_errors",
                    "Errors inside the publisher (connect, send, encode)",
                    ("kind",),
                ),
                sources=sources,
            )
        return _metrics


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
    collector = existing_or(name, lambda: Counter(name, doc, labels))
    assert isinstance(collector, Counter)
    return collector


def _histogram() -> Histogram:
    name = "kvscope_publisher_send_latency_seconds"
    collector = existing_or(
        name,
        lambda: Histogram(
            name,
            "Time from publish() to the broker's acknowledgement, per record batch",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        ),
    )
    assert isinstance(collector, Histogram)
    return collector

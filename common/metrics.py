"""The one way every kvscope metric is declared: `counter()`, `gauge()`, `histogram()`.

Each returns the collector of that name already in the default registry (e.g. after a
module reload) instead of failing on a duplicate, so the publisher's, the bridge's, the
transfer timer's and the collector's metrics are declared alike. Metrics register in the
default registry, so they show on the engine's own `/metrics` (vLLM serves it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

_C = TypeVar("_C", Counter, Gauge, Histogram)


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    """The counter `name` of the default registry, declared on first use."""
    return _declared(Counter, name, lambda: Counter(name, documentation, labels))


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
    """The gauge `name` of the default registry, declared on first use."""
    return _declared(Gauge, name, lambda: Gauge(name, documentation, labels))


def histogram(
    name: str,
    documentation: str,
    labels: Sequence[str] = (),
    *,
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
) -> Histogram:
    """The histogram `name` of the default registry, declared on first use."""
    return _declared(
        Histogram, name, lambda: Histogram(name, documentation, labels, buckets=buckets)
    )


def _declared(kind: type[_C], name: str, make: Callable[[], _C]) -> _C:
    collector = REGISTRY._names_to_collectors.get(name)
    if collector is None:
        return make()
    if not isinstance(collector, kind):
        raise TypeError(f"metric {name} is already registered as a {type(collector).__name__}")
    return collector

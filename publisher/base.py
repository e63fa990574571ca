"""The publisher contract (`Publisher`), the no-op `NullPublisher` and the registry factory."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from kvscope.schemas import AnyBody, ConfigError


class Publisher(ABC):
    """Publishes one source's records (envelope bodies) to kvscope's streams.

    The contract, for every implementation:

    - `publish()` never blocks the caller and never raises into it: it hands the body
      to a bounded queue and returns. Whatever goes wrong (queue full, broker down,
      encoding failed, publisher shut down) is counted, never thrown.
    - Each record gets `seq` at `publish()` time, contiguous per (source, epoch, stream),
      so a record lost anywhere later leaves a visible hole.
    - Every drop is reported as a `Gap` body on the same stream naming the lost seq
      range, as soon as the publisher can send again.
    - Records of one source keep their order per stream (one Kafka partition per source).
    """

    @abstractmethod
    def publish(self, body: AnyBody, ts: float | None = None) -> None:
        """Queue one body; its stream follows from its type.

        `ts` is the engine timestamp (seconds since the epoch); by default the body's
        own `ts` (KV event batches) or now. A `Gap` body reports data lost before it
        reached the publisher (e.g. engine events a bridge missed): the publisher
        reserves `last_seq - first_seq + 1` seqs on the kv-events stream and reports
        them lost with the Gap's reason.
        """

    def publish_raw(
        self, stream: str, raw: Any, ts: float | None, convert: Callable[[Any], AnyBody]
    ) -> None:
        """Queue an engine-native object of `stream` that `convert` turns into its body.

        A publisher with its own thread converts there, so the caller's cost stays an
        append (`SourcePublisher`); this default converts at once and publishes.
        """
        self.publish(convert(raw), ts)

    @abstractmethod
    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop accepting records and deliver what is queued within `timeout_s`."""


class NullPublisher(Publisher):
    """Does nothing: what the engine gets when kvscope is off."""

    def publish(self, body: AnyBody, ts: float | None = None) -> None:
        """Discard the body."""

    def publish_raw(
        self, stream: str, raw: Any, ts: float | None, convert: Callable[[Any], AnyBody]
    ) -> None:
        """Discard the object without converting it."""

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Nothing to stop."""


PublisherFactory = Callable[..., Publisher]
_REGISTRY: dict[str, PublisherFactory] = {}


def register_publisher(name: str, factory: PublisherFactory) -> None:
    """Make `create_publisher(name, ...)` call `factory(...)`; names are unique."""
    if name in _REGISTRY:
        raise ConfigError(f"publisher {name!r} is already registered")
    _REGISTRY[name] = factory


def create_publisher(name: str, **kwargs: Any) -> Publisher:
    """Create a registered publisher by name ("null", "kafka", or one you registered).

    "kafka" takes `source`, optional `config` (a `PublisherConfig`, default from the
    environment) and `epoch`, and uses the process-wide shared `KafkaPublisher`.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown publisher {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return factory(**kwargs)


register_publisher("null", lambda **_: NullPublisher())

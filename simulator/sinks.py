"""Where the fleet simulator's bodies go: Kafka, through the real publisher.

Used by `kvscope simulate`, the demo and the analytics tests. A sink is any callable
`(source, epoch, body, ts)` with `close()`; the collector's `DirectSink` writes straight
into the raw tables instead (`kvscope.collector.pipeline.direct_sink`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from kvscope.schemas import AnyBody, Source

if TYPE_CHECKING:
    from kvscope.publisher.config import PublisherConfig


class KafkaSink:
    """Publishes simulator bodies through the real Kafka publisher, one source each.

    The simulator runs faster than real time, so it waits while the publisher's queue
    is more than half full instead of letting `publish()` drop records. `config` carries
    further publisher settings (security, timeouts, sizes; e.g. `PublisherConfig.from_env`);
    `bootstrap_servers` and `topic_prefix` override its own.
    """

    def __init__(
        self, bootstrap_servers: str, topic_prefix: str, config: PublisherConfig | None = None
    ) -> None:
        from kvscope.publisher.config import PublisherConfig
        from kvscope.publisher.kafka import KafkaPublisher

        self.kafka = KafkaPublisher(
            dataclasses.replace(
                config or PublisherConfig(),
                bootstrap_servers=bootstrap_servers,
                topic_prefix=topic_prefix,
            )
        )
        self._high_water = self.kafka.config.queue_size // 2
        self._pubs: dict[str, Any] = {}
        self.sent = 0
        """Records handed to the publisher."""

    def __call__(self, source: Source, epoch: int, body: AnyBody, ts: float) -> None:
        pub = self._pubs.get(source.key)
        if pub is None:
            pub = self._pubs[source.key] = self.kafka.for_source(source, epoch)
        while self.kafka.queue_depth() > self._high_water:
            time.sleep(0.005)
        pub.publish(body, ts=ts)
        self.sent += 1

    def close(self, timeout_s: float | None = None) -> bool:
        """Deliver everything and stop; False if something could not be delivered.

        By default it waits twice the delivery timeout plus 5 s: a record not acknowledged
        within the delivery timeout is lost anyway, and the rest is time for the Gaps.
        """
        if timeout_s is None:
            timeout_s = 2 * self.kafka.config.delivery_timeout_s + 5.0
        return self.kafka.shutdown(timeout_s)

    def lost(self) -> dict[str, int]:
        """Records the publisher dropped so far, by reason (`kvscope_publisher_dropped`).

        The publisher's counters are per process: this is everything this process lost.
        """
        lost: dict[str, int] = defaultdict(int)
        for family in self.kafka.metrics.dropped.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    lost[sample.labels["reason"]] += int(sample.value)
        return dict(lost)

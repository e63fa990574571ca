"""Where the fleet simulator's bodies go: Kafka (the real publisher) or ClickHouse directly.

Used by `kvscope simulate`, the demo, the analytics tests and the query benchmark.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, NamedTuple

from kvscope.schemas import DEFAULT_TOPIC_PREFIX, Body, ConfigError, Envelope, Source, encode
from kvscope.schemas.streams import stream_of, topic_for

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

    def __call__(self, source: Source, epoch: int, body: Body, ts: float) -> None:
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


class _Record(NamedTuple):
    """A Kafka-like record for the collector's decode stage."""

    offset: int
    key: bytes | None
    value: bytes | None


class DirectSink:
    """Turns simulator bodies into raw-table rows and inserts them without Kafka.

    Each body is encoded as the Kafka record value a publisher would send, then decoded
    and turned into rows by the collector's own decode and column stages. `_topic` is
    the stream's topic, `_partition` 0 and `_offset` a running counter per stream (there
    is no Kafka position). Not exactly-once: for benchmarks and analytics experiments.
    """

    def __init__(self, client: Any, topic_prefix: str = DEFAULT_TOPIC_PREFIX, batch: int = 20_000):
        self.client = client
        self._prefix = topic_prefix
        self._batch = batch
        self._seq: dict[tuple[str, str], int] = defaultdict(int)
        self._pending: dict[str, list[_Record]] = defaultdict(list)
        self._offsets: dict[str, int] = defaultdict(int)

    def __call__(self, source: Source, epoch: int, body: Body, ts: float) -> None:
        stream = stream_of(body)
        seq = self._seq[(source.key, stream)]
        self._seq[(source.key, stream)] = seq + 1
        offset = self._offsets[stream]
        self._offsets[stream] = offset + 1
        value = encode(Envelope(source=source, epoch=epoch, seq=seq, ts=ts, body=body))
        pending = self._pending[stream]
        pending.append(_Record(offset, source.key.encode(), value))
        if len(pending) >= self._batch:
            self._flush(stream)

    def _flush(self, stream: str) -> None:
        from kvscope.collector.pipeline import columns
        from kvscope.collector.pipeline.decode import decode_records
        from kvscope.collector.storage.tables import STREAM_TABLES

        decoded = decode_records(stream, self._pending.pop(stream, []))
        if decoded.bad:
            raise ConfigError(f"simulator produced undecodable records: {decoded.bad[0].reason}")
        if decoded.envelopes:
            topic = topic_for(stream, self._prefix)
            rows = columns.stream_rows(stream, decoded.envelopes, decoded.offsets, topic, 0)
            self.client.insert_arrow(STREAM_TABLES[stream], rows)

    def close(self) -> bool:
        """Insert everything still pending."""
        for stream in list(self._pending):
            self._flush(stream)
        return True

"""Bodies straight into the raw tables, without Kafka: the simulator's direct sink.

Used by `kvscope simulate --clickhouse` without a broker, the analytics tests and the
query benchmark. It has the simulator's sink shape (`(source, epoch, body, ts)`, `close()`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.decode import decode_records
from kvscope.collector.storage.client import Client
from kvscope.collector.storage.tables import STREAM_TABLES
from kvscope.schemas import DEFAULT_TOPIC_PREFIX, AnyBody, ConfigError, Envelope, Source, encode
from kvscope.schemas.streams import stream_of, topic_for


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

    def __init__(
        self, client: Client, topic_prefix: str = DEFAULT_TOPIC_PREFIX, batch: int = 20_000
    ):
        self.client = client
        self._prefix = topic_prefix
        self._batch = batch
        self._seq: dict[tuple[str, str], int] = defaultdict(int)
        self._pending: dict[str, list[_Record]] = defaultdict(list)
        self._offsets: dict[str, int] = defaultdict(int)

    def __call__(self, source: Source, epoch: int, body: AnyBody, ts: float) -> None:
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

"""`KafkaPublisher`: one background sender for the process, one `Publisher` per source.

The caller's cost per record is a seq increment and a deque append under a per-source
lock; encoding, batching and sending happen on the sender thread, which wakes on its
own every `linger_ms` (publish() never wakes it). See `sender.py` for that side.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import random
import threading
import time
import weakref
from typing import Any

from kvscope.publisher.base import NullPublisher, Publisher, register_publisher
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.metrics import publisher_metrics
from kvscope.publisher.queue import Convert, Item, RecordQueue
from kvscope.publisher.sender import Sender
from kvscope.schemas import (
    STREAM_BODIES,
    AnyBody,
    Gap,
    KVEventBatch,
    Source,
    stream_of,
    topic_for,
)

log = logging.getLogger(__name__)


class SourcePublisher(Publisher):
    """The `Publisher` of one source and epoch, feeding its `KafkaPublisher`'s queue.

    Thread-safe: several threads may publish on one source (order per stream holds).
    """

    def __init__(self, kafka: KafkaPublisher, source: Source, epoch: int) -> None:
        self.source = source
        self.epoch = epoch
        self.key = source.key.encode()
        self._kafka = kafka
        self._lock = threading.Lock()
        self._next_seq = dict.fromkeys(STREAM_BODIES, 0)
        self._closed = False

    def __repr__(self) -> str:
        return f"SourcePublisher({self.source.key!r}, epoch={self.epoch})"

    def next_seq(self, stream: str) -> int:
        """The next seq of `stream` (publish() reads it; tests and Gaps use it)."""
        return self._next_seq[stream]

    def publish(self, body: AnyBody, ts: float | None = None) -> None:
        """Queue a kvscope body; see `Publisher.publish` for the contract."""
        try:
            try:
                stream = stream_of(body)
            except ValueError:
                if isinstance(body, Gap):
                    self.report_loss("kv-events", body.last_seq - body.first_seq + 1, body.reason)
                    return
                self._kafka.note_error("unknown_body", TypeError(type(body).__name__))
                return
            self._enqueue(stream, body, ts, None)
        except Exception:
            self._kafka.note_error("publish")

    def publish_raw(self, stream: str, raw: Any, ts: float | None, convert: Convert) -> None:
        """Queue an engine-native object that `convert` turns into a body on the sender thread.

        Keeps the caller's cost at an append (used by the vLLM plugin for KV event batches).
        """
        try:
            self._enqueue(stream, raw, ts, convert)
        except Exception:
            self._kafka.note_error("publish")

    def report_loss(self, stream: str, count: int, reason: str) -> None:
        """Reserve `count` seqs of `stream` for records lost upstream and report them as a Gap."""
        if count <= 0:
            return
        with self._lock:
            first = self._next_seq[stream]
            self._next_seq[stream] = first + count
        self._kafka.queue.lost(self, stream, first, first + count - 1, reason or "upstream")

    def take_seq(self, stream: str) -> int:
        """Reserve one seq (for a Gap record the sender emits)."""
        with self._lock:
            seq = self._next_seq[stream]
            self._next_seq[stream] = seq + 1
            return seq

    def _enqueue(self, stream: str, body: Any, ts: float | None, convert: Convert | None) -> None:
        if ts is None:
            ts = body.ts if isinstance(body, KVEventBatch) or convert else time.time()
        kafka = self._kafka
        with self._lock:
            seq = self._next_seq[stream]
            self._next_seq[stream] = seq + 1
            if self._closed or kafka.closed:
                reason = "closed"
            elif kafka.queue.put(Item(self, stream, seq, ts, body, convert, time.monotonic())):
                return
            else:
                reason = "queue_full"
        kafka.queue.lost(self, stream, seq, seq, reason)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop this source and flush the shared sender (the sender keeps running)."""
        self._closed = True
        self._kafka.flush(timeout_s)


class KafkaPublisher:
    """One background thread and one aiokafka producer, shared by any number of sources.

    Use `for_source()` to get each source's `Publisher`; `flush()` and `shutdown()` take
    deadlines. Records the broker does not acknowledge within `delivery_timeout_s` (or that
    do not fit the queue) are dropped, counted and reported as `Gap` records once Kafka
    answers again.
    """

    def __init__(self, config: PublisherConfig) -> None:
        config.validate()
        self.config = config
        self.metrics = publisher_metrics()
        self.queue = RecordQueue(config.queue_size, self.metrics.dropped)
        self.metrics.sources.add(self)
        self.closed = False
        topic = functools.partial(topic_for, prefix=config.topic_prefix)
        self._sender = Sender(config, queue=self.queue, metrics=self.metrics, topic=topic)
        self._thread = threading.Thread(
            target=self._sender.run_forever, name="kvscope-publisher", daemon=True
        )
        self._thread.start()
        self_ref = weakref.ref(self)
        self._atexit = lambda: _shutdown_if_alive(self_ref)
        atexit.register(self._atexit)
        log.info(
            "kvscope publisher started: brokers %s, topics %s*, compression %s",
            config.bootstrap_servers,
            config.topic_prefix,
            config.compression,
        )

    def for_source(self, source: Source, epoch: int | None = None) -> SourcePublisher:
        """A `Publisher` for one source; `epoch` is a random u64 unless given."""
        if epoch is None:
            epoch = random.getrandbits(64)
        return SourcePublisher(self, source, epoch)

    def topic(self, stream: str) -> str:
        """The Kafka topic of a stream under this publisher's prefix."""
        return topic_for(stream, self.config.topic_prefix)

    def queue_depth(self) -> int:
        """Records waiting for the sender."""
        return len(self.queue)

    def queue_capacity(self) -> int:
        """Records the queue holds before publish() drops (`queue_size`)."""
        return self.config.queue_size

    def note_error(self, kind: str, exc: BaseException | None = None) -> None:
        """Count an error without raising; log the first one of each kind (then only count)."""
        self.metrics.note_error(kind, exc)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Deliver everything queued (and pending Gaps); False if the deadline passed first."""
        return self._sender.call(self._sender.flush(), timeout_s) is True

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Flush within `timeout_s`, stop the producer and the thread. Safe to call twice."""
        if self.closed:
            return True
        deadline = time.monotonic() + timeout_s
        delivered = self.flush(timeout_s)
        self.closed = True
        self._sender.call(self._sender.stop(), max(0.1, deadline - time.monotonic()))
        self._thread.join(max(0.1, deadline - time.monotonic()))
        left = self.queue.clear()
        if left:
            self.metrics.dropped.labels(stream="any", reason="shutdown").inc(left)
        atexit.unregister(self._atexit)
        log.info(
            "kvscope publisher stopped (all delivered: %s, dropped at exit: %d)", delivered, left
        )
        return delivered and not left


def _shutdown_if_alive(ref: weakref.ref[KafkaPublisher]) -> None:
    publisher = ref()
    if publisher is not None:
        publisher.shutdown(2.0)


_shared_lock = threading.Lock()
_shared: dict[tuple[int, str], KafkaPublisher] = {}


def shared_kafka_publisher(config: PublisherConfig) -> KafkaPublisher:
    """The process-wide `KafkaPublisher` for these brokers and prefix (made after a fork, too)."""
    key = (os.getpid(), repr((config.bootstrap_servers, config.topic_prefix, config.client_id)))
    with _shared_lock:
        publisher = _shared.get(key)
        if publisher is None or publisher.closed:
            publisher = _shared[key] = KafkaPublisher(config)
        return publisher


def _create_kafka(
    *, source: Source, config: PublisherConfig | None = None, epoch: int | None = None
) -> Publisher:
    config = config if config is not None else PublisherConfig.from_env()
    if not config.validate().enabled:
        return NullPublisher()
    return shared_kafka_publisher(config).for_source(source, epoch)


register_publisher("kafka", _create_kafka)

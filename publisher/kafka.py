"""`KafkaPublisher`: one background sender for the process, one `Publisher` per source.

The caller's cost per record is a seq increment and a deque append under a per-source
lock; encoding, batching and sending happen on the sender thread, which sleeps while
the engine is idle and otherwise wakes once per `linger_ms` (publish() wakes it only for
the first record after a quiet spell or a full batch). See `sender.py` for that side.

Supervision: a sender thread found dead (by a publish that finds the queue full or
wakes it, or by `flush()`) is started again, logged and counted
(`kvscope_publisher_sender_restarts_total`). Fork safety: in a forked child every
inherited publisher gets fresh locks and an empty queue (the parent's records are the
parent's to send), every source a new epoch, and the sender starts on the child's first
record.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import secrets
import threading
import time
import weakref
from typing import Any, Protocol

from kvscope.publisher.base import NullPublisher, Publisher, register_publisher
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.metrics import publisher_metrics, reset_metric_locks
from kvscope.publisher.queue import Convert, Item, RecordQueue
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


def new_epoch() -> int:
    """A random u64 epoch from the OS's entropy, not from `random`'s global state: vLLM seeds
    that state (`seed`, 0 by default) in every engine process, so `random.getrandbits` gave a
    restarted engine the epoch of its previous run."""
    return secrets.randbits(64)


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
        _sources.add(self)

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
        if reason == "queue_full":
            kafka.ensure_sender()

    def _after_fork_in_child(self) -> None:
        """A forked child's copy: a fresh lock, and a new epoch whose seqs start at 0."""
        self._lock = threading.Lock()
        self.epoch = new_epoch()
        self._next_seq = dict.fromkeys(STREAM_BODIES, 0)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop this source and flush the shared sender (the sender keeps running)."""
        self._closed = True
        self._kafka.flush(timeout_s)


class SenderThread(Protocol):
    """What a `KafkaPublisher` needs of its sender: a thread body, a wake-up from any
    thread, and flush and stop with deadlines. `Sender` (aiokafka in this process) and
    `RelaySender` (records handed to a per-host relay) both are one."""

    rounds: int
    """Send rounds so far (each one a wake of the thread)."""

    def run_forever(self) -> None:
        """Thread body: send until stopped; never raises."""
        ...

    def wake(self) -> None:
        """Wake the thread (called from publishing threads)."""
        ...

    def flush_within(self, timeout_s: float) -> bool:
        """Deliver what is queued and pending; False if the deadline passed first."""
        ...

    def stop_within(self, timeout_s: float) -> None:
        """Stop the thread within the deadline."""
        ...


class KafkaPublisher:
    """One background sender thread (aiokafka here, or a relay client), shared by any number
    of sources.

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
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_sender()
        _publishers.add(self)
        self_ref = weakref.ref(self)
        self._atexit = lambda: _shutdown_if_alive(self_ref)
        atexit.register(self._atexit)
        log.info(
            "kvscope publisher started: brokers %s, topics %s*, compression %s",
            config.bootstrap_servers,
            config.topic_prefix,
            config.compression,
        )

    def _start_sender(self) -> None:
        """Start the sender thread: the relay client when `relay` is set (aiokafka is then
        never imported in this process), else the in-process aiokafka `Sender`."""
        topic = functools.partial(topic_for, prefix=self.config.topic_prefix)
        sender: SenderThread
        if self.config.relay:
            from kvscope.publisher.relay_client import RelaySender

            sender = RelaySender(self.config, queue=self.queue, metrics=self.metrics, topic=topic)
        else:
            from kvscope.publisher.sender import Sender

            sender = Sender(self.config, queue=self.queue, metrics=self.metrics, topic=topic)
        self._sender = sender
        self.queue.waker = self._wake_sender
        self._thread = threading.Thread(
            target=self._sender.run_forever, name="kvscope-publisher", daemon=True
        )
        self._thread.start()

    def _wake_sender(self) -> None:
        if self.ensure_sender():
            self._sender.wake()

    def sender_rounds(self) -> int:
        """How many send rounds (wakes) the current sender thread has had."""
        return self._sender.rounds

    def sender_alive(self) -> bool:
        """Whether the sender thread is running (False after a fork until the first record)."""
        return self._thread is not None and self._thread.is_alive()

    def ensure_sender(self) -> bool:
        """Start the sender thread again if it is gone; True if it was running.

        A thread found dead (not one never started, as in a forked child) is logged at
        ERROR and counted in `kvscope_publisher_sender_restarts_total`.
        """
        if self.closed or self.sender_alive():
            return True
        with self._start_lock:
            if self.sender_alive():
                return True
            if self._thread is not None:
                log.error("kvscope publisher: the sender thread died; starting a new one")
                self.metrics.sender_restarts.inc()
            self._start_sender()
        return False

    def _after_fork_in_child(self) -> None:
        """A forked child's copy: no thread (it did not survive the fork), fresh locks, an
        empty queue and ledger (what the parent queued or lost, the parent reports)."""
        self._start_lock = threading.Lock()
        self._thread = None
        self.queue = RecordQueue(self.config.queue_size, self.metrics.dropped)
        self.queue.waker = self._wake_sender
        self.queue.armed = True

    def for_source(self, source: Source, epoch: int | None = None) -> SourcePublisher:
        """A `Publisher` for one source; `epoch` is a random u64 unless given."""
        if epoch is None:
            epoch = new_epoch()
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
        if not self.sender_alive() and not self.queue and not len(self.queue.losses):
            return True
        self.ensure_sender()
        return self._sender.flush_within(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Flush within `timeout_s`, stop the producer and the thread. Safe to call twice."""
        if self.closed:
            return True
        deadline = time.monotonic() + timeout_s
        delivered = self.flush(timeout_s)
        self.closed = True
        if self._thread is not None:
            self._sender.stop_within(max(0.1, deadline - time.monotonic()))
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
_publishers: weakref.WeakSet[KafkaPublisher] = weakref.WeakSet()
_sources: weakref.WeakSet[SourcePublisher] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """`os.register_at_fork` hook: make every inherited publisher usable in the child.

    Only the forking thread survives a fork, so any lock another thread held stays held
    forever: every lock the publish path takes is replaced (kvscope's and those of its
    Prometheus metrics). The child keeps the parent's shared publishers (one sender per
    process) under its own pid.
    """
    global _shared_lock
    _shared_lock = threading.Lock()
    pid = os.getpid()
    for (_, key), publisher in list(_shared.items()):
        _shared[(pid, key)] = publisher
    for publisher in list(_publishers):
        publisher._after_fork_in_child()
    for source in list(_sources):
        source._after_fork_in_child()
    reset_metric_locks()


os.register_at_fork(after_in_child=_after_fork_in_child)


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

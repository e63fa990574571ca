"""Broker outages: publish() never blocks or raises; what was lost comes back as Gap records.

Uses its own broker on a fixed port so the test can stop and restart it (memory storage:
a restart loses the topics, so the test reads only what arrives after the restart).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from kvscope.collector.local.broker import LocalBroker
from kvscope.publisher import KafkaPublisher, SourcePublisher
from kvscope.schemas import BlockStored, Gap, KVEventBatch, Source
from prometheus_client import REGISTRY
from support.publisher_readback import consume, covered_seqs

MAX_PUBLISH_S = 0.05
"""Far below the delivery timeout: a publish() that waited for the broker would exceed it."""


def publish_timed(publisher, count: int, pace_s: float = 0.0) -> list[float]:  # type: ignore[no-untyped-def]
    """Publish `count` batches; return how long each publish() call took."""
    durations = []
    for i in range(count):
        body = KVEventBatch(ts=time.time(), events=[BlockStored(block_hashes=[i], block_size=16)])
        started = time.perf_counter()
        publisher.publish(body)
        durations.append(time.perf_counter() - started)
        if pace_s:
            time.sleep(pace_s)
    return durations


def dropped_total() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "kvscope_publisher_dropped"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def delivering(
    make_publisher: Callable[..., KafkaPublisher], broker: LocalBroker, prefix: str, name: str
) -> tuple[KafkaPublisher, SourcePublisher, list[float]]:
    """Start `broker`, publish 20 records with a 1 s delivery timeout and see them delivered."""
    broker.start()
    kafka = make_publisher(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=prefix,
        delivery_timeout_s=1.0,
        reconnect_backoff_max_s=0.2,
        queue_size=100,
    )
    publisher = kafka.for_source(Source(instance=name))
    durations = publish_timed(publisher, 20)
    assert kafka.flush(10.0)
    return kafka, publisher, durations


def every_seq_arrived_or_reported(
    broker: LocalBroker, kafka: KafkaPublisher, publisher: SourcePublisher
) -> list[Gap]:
    """Read kv-events back; assert each seq published arrived or a Gap names it; the Gaps."""
    wanted = set(range(publisher.next_seq("kv-events")))
    records = consume(
        broker.bootstrap_servers, [kafka.topic("kv-events")], lambda r: covered_seqs(r) >= wanted
    )
    assert covered_seqs(records) == wanted
    return [r.envelope.body for r in records if isinstance(r.envelope.body, Gap)]


def test_broker_down_at_start_then_up(
    own_broker: LocalBroker, make_publisher: Callable[..., KafkaPublisher], topic_prefix: str
) -> None:
    kafka = make_publisher(
        bootstrap_servers=own_broker.bootstrap_servers,
        topic_prefix=topic_prefix,
        delivery_timeout_s=1.0,
        reconnect_backoff_max_s=0.2,
    )
    publisher = kafka.for_source(Source(instance="early"))
    durations = publish_timed(publisher, 30)
    time.sleep(1.6)
    assert not kafka.flush(0.2)
    own_broker.start()
    durations += publish_timed(publisher, 30, pace_s=0.005)
    assert kafka.flush(15.0)

    lost = every_seq_arrived_or_reported(own_broker, kafka, publisher)
    assert lost, "records queued while no broker answered must be reported lost"
    assert {g.reason for g in lost} == {"broker_unavailable"}
    assert sum(g.last_seq - g.first_seq + 1 for g in lost) >= 30
    assert max(durations) < MAX_PUBLISH_S


def test_broker_paused_mid_run_loses_nothing_unreported(
    own_broker: LocalBroker, make_publisher: Callable[..., KafkaPublisher], topic_prefix: str
) -> None:
    """SIGSTOP freezes the real broker (it stops answering, keeps its topics), SIGCONT resumes."""
    kafka, publisher, durations = delivering(make_publisher, own_broker, topic_prefix, "paused")
    paused_at = publisher.next_seq("kv-events")

    pid = own_broker._process.pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    try:
        durations += publish_timed(publisher, 300, pace_s=0.005)
        time.sleep(1.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    durations += publish_timed(publisher, 50, pace_s=0.005)
    assert kafka.flush(20.0)

    lost = every_seq_arrived_or_reported(own_broker, kafka, publisher)
    assert lost, "the pause must have cost records"
    assert all(g.first_seq >= paused_at for g in lost)
    assert {g.reason for g in lost} <= {"broker_unavailable", "queue_full"}
    assert max(durations) < MAX_PUBLISH_S


def test_broker_restarted_mid_run_publisher_reconnects(
    own_broker: LocalBroker, make_publisher: Callable[..., KafkaPublisher], topic_prefix: str
) -> None:
    """A real crash (SIGKILL) and restart: connections refused, then a new broker process.

    Memory storage loses the topics; the test recreates them (as Kafka would have kept them)
    and checks the publisher delivers what it publishes from then on.
    """
    kafka, publisher, durations = delivering(make_publisher, own_broker, topic_prefix, "restarted")
    before = dropped_total()

    os.kill(own_broker._process.pid, signal.SIGKILL)  # type: ignore[union-attr]
    own_broker.stop()
    durations += publish_timed(publisher, 300, pace_s=0.005)
    assert dropped_total() > before
    own_broker.start()
    consume(own_broker.bootstrap_servers, [kafka.topic("kv-events")], lambda r: True, 5.0)
    time.sleep(1.5)
    resumed_at = publisher.next_seq("kv-events")
    durations += publish_timed(publisher, 50, pace_s=0.005)
    assert kafka.flush(20.0)

    last = publisher.next_seq("kv-events") - 1
    records = consume(
        own_broker.bootstrap_servers,
        [kafka.topic("kv-events")],
        lambda r: covered_seqs(r) >= set(range(resumed_at, last + 1)),
    )
    assert covered_seqs(records) >= set(range(resumed_at, last + 1))
    assert max(durations) < MAX_PUBLISH_S


def test_shutdown_with_no_broker_returns_within_its_deadline(
    own_broker: LocalBroker, make_publisher: Callable[..., KafkaPublisher], topic_prefix: str
) -> None:
    kafka = make_publisher(
        bootstrap_servers=own_broker.bootstrap_servers, topic_prefix=topic_prefix
    )
    publish_timed(kafka.for_source(Source(instance="nobody")), 10)
    started = time.monotonic()
    assert kafka.shutdown(1.0) is False
    assert time.monotonic() - started < 2.0

"""KafkaPublisher against the real local broker: delivery, seq, epoch, keys, drops and Gaps."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kvscope.publisher import (
    KafkaPublisher,
    NullPublisher,
    PublisherConfig,
    SourcePublisher,
    create_publisher,
    shared_kafka_publisher,
)
from kvscope.schemas import (
    BlockRemoved,
    BlockStored,
    EngineStats,
    Gap,
    KVEventBatch,
    RequestFinished,
    Source,
    topic_for,
)
from prometheus_client import REGISTRY
from support.publisher_readback import Record, consume, covered_seqs, dropped


def batch(i: int) -> KVEventBatch:
    return KVEventBatch(
        ts=1_700_000_000.0 + i,
        events=[BlockStored(block_hashes=[i, 2**64 - 1 - i], block_size=16), BlockRemoved([i])],
    )


def test_records_arrive_decoded_in_order_with_contiguous_seq_epoch_and_key(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    sources = [Source(instance="host-a:8000", model="m", dp_rank=r) for r in range(3)]
    publishers = [kafka.for_source(s) for s in sources]
    fixed = kafka.for_source(Source(instance="host-b:8000"), epoch=42)
    for i in range(50):
        for publisher in publishers:
            publisher.publish(batch(i))
    for publisher in publishers:
        publisher.publish(EngineStats(capacity_blocks=100, block_size=16, usage=0.25))
    fixed.publish(RequestFinished(request_id="r1", prompt_tokens=7, cached_tokens=4), ts=5.0)
    assert kafka.flush(10.0)
    assert [t.name for t in threading.enumerate()].count("kvscope-publisher") >= 1

    topics = [kafka.topic(s) for s in ("kv-events", "engine-stats", "requests")]
    records = consume(bootstrap_servers, topics, lambda r: len(r) >= 50 * 3 + 3 + 1)
    assert len(records) == 154
    by_key: dict[bytes, list[Record]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    assert set(by_key) == {b"host-a:8000/0", b"host-a:8000/1", b"host-a:8000/2", b"host-b:8000/0"}
    for publisher in publishers:
        mine = by_key[publisher.key]
        events = [r.envelope for r in mine if r.topic == kafka.topic("kv-events")]
        assert [e.seq for e in events] == list(range(50))
        assert {r.envelope.epoch for r in mine} == {publisher.epoch}
        assert all(e.source == publisher.source for e in events)
        assert [e.body for e in events] == [batch(i) for i in range(50)]
        assert [e.ts for e in events] == [batch(i).ts for i in range(50)]
        stats = [r.envelope for r in mine if r.topic == kafka.topic("engine-stats")]
        assert [(s.seq, s.body.usage) for s in stats] == [(0, 0.25)]
    request = by_key[b"host-b:8000/0"][0].envelope
    assert (request.epoch, request.seq, request.ts) == (42, 0, 5.0)
    assert request.body == RequestFinished(request_id="r1", prompt_tokens=7, cached_tokens=4)
    assert len({p.epoch for p in publishers}) == 3


def test_each_queue_overflow_is_counted_and_reported_as_its_own_exact_gap(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    """Two overflow episodes, each while the sender is held inside a conversion (so the
    queue cannot drain under the test, whatever the machine's load): every drop is counted
    and each episode is reported as one Gap naming exactly its dropped seqs."""
    queue_size = 10
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, queue_size=queue_size
    )
    publisher = kafka.for_source(Source(instance="full"))
    before = dropped("kv-events", "queue_full")
    expected_gaps = []
    for _ in range(2):
        entered, release = threading.Event(), threading.Event()

        def stall(raw: int, entered=entered, release=release) -> KVEventBatch:
            entered.set()
            assert release.wait(60), "the test never released the sender"
            return batch(raw)

        first = publisher.next_seq("kv-events")
        publisher.publish_raw("kv-events", first, batch(first).ts, stall)
        assert entered.wait(30), "the sender never picked up the held record"
        for i in range(3 * queue_size):
            publisher.publish(batch(first + 1 + i))
        expected_gaps.append((first + 1 + queue_size, first + 3 * queue_size, "queue_full"))
        release.set()
        assert kafka.flush(10.0)
    assert dropped("kv-events", "queue_full") - before == 2 * 2 * queue_size

    wanted = set(range(publisher.next_seq("kv-events")))
    records = consume(
        bootstrap_servers, [kafka.topic("kv-events")], lambda r: covered_seqs(r) >= wanted
    )
    assert covered_seqs(records) == wanted
    gaps = sorted(
        (r.envelope.body for r in records if isinstance(r.envelope.body, Gap)),
        key=lambda g: g.first_seq,
    )
    assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == expected_gaps
    delivered = [r.envelope for r in records if isinstance(r.envelope.body, KVEventBatch)]
    assert all(e.body == batch(e.seq) for e in delivered)
    assert len(delivered) == 2 * (1 + queue_size)


def test_gap_bodies_from_callers_reserve_seqs_for_upstream_losses(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="bridge"))
    publisher.publish(batch(0))
    publisher.publish(Gap(first_seq=100, last_seq=104, reason="replay_missing"))
    publisher.publish(batch(1))
    assert kafka.flush(10.0)
    records = consume(bootstrap_servers, [kafka.topic("kv-events")], lambda r: len(r) >= 3)
    bodies = {r.envelope.seq: r.envelope.body for r in records}
    assert bodies[0] == batch(0)
    assert bodies[6] == batch(1)
    assert bodies[7] == Gap(first_seq=1, last_seq=5, reason="replay_missing")


def test_publish_after_shutdown_never_raises_and_counts_the_drop(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="late"))
    publisher.publish(batch(0))
    assert kafka.shutdown(5.0)
    before = dropped("kv-events", "closed")
    publisher.publish(batch(1))
    publisher.publish("not a body")  # type: ignore[arg-type]
    assert dropped("kv-events", "closed") - before == 1
    assert kafka.shutdown(1.0)


def test_shutdown_flushes_everything_within_its_deadline(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=1000
    )
    publisher = kafka.for_source(Source(instance="bye"))
    for i in range(2000):
        publisher.publish(batch(i))
    started = time.monotonic()
    assert kafka.shutdown(10.0)
    assert time.monotonic() - started < 10.0
    records = consume(bootstrap_servers, [kafka.topic("kv-events")], lambda r: len(r) >= 2000)
    assert sorted(r.envelope.seq for r in records) == list(range(2000))


def test_several_publishers_share_one_set_of_metrics(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    first = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    second = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    assert first.metrics is second.metrics
    before = REGISTRY.get_sample_value("kvscope_publisher_published_total", {"stream": "requests"})
    for kafka in (first, second):
        kafka.for_source(Source(instance="m")).publish(
            RequestFinished(request_id="x", prompt_tokens=1)
        )
        assert kafka.flush(10.0)
    after = REGISTRY.get_sample_value("kvscope_publisher_published_total", {"stream": "requests"})
    assert after - (before or 0.0) == 2
    assert REGISTRY.get_sample_value("kvscope_publisher_queue_depth") == 0
    assert REGISTRY.get_sample_value("kvscope_publisher_send_latency_seconds_count") >= 2


def test_registry_kafka_publisher_uses_the_shared_sender(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    config = PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    first = create_publisher("kafka", source=Source(instance="reg-a"), config=config)
    second = create_publisher("kafka", source=Source(instance="reg-b"), config=config, epoch=9)
    assert isinstance(first, SourcePublisher) and isinstance(second, SourcePublisher)
    assert first._kafka is second._kafka is shared_kafka_publisher(config)
    assert second.epoch == 9
    first.publish(RequestFinished(request_id="via-registry", prompt_tokens=3))
    first.shutdown(10.0)
    [record] = consume(bootstrap_servers, [topic_for("requests", topic_prefix)], lambda r: r)
    assert record.envelope.body.request_id == "via-registry"
    off = create_publisher("kafka", source=Source(instance="x"), config=PublisherConfig())
    assert isinstance(off, NullPublisher)
    assert shared_kafka_publisher(config).shutdown(5.0)

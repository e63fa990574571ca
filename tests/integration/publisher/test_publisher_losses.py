"""Every loss reason of the publisher, one test each, through the real broker.

Each test publishes a short stream in which chosen records cannot be delivered for one
reason, reads the topic back and checks: every other record arrived, each lost seq is
named by a `Gap` with that reason (adjacent losses merged into one Gap), the drop counter
moved by the number lost. Shapes are swept: a loss at the start, two apart, two adjacent.

`send_failed` (the broker refusing a batch for good) is in test_publisher_send_failed.py:
the local broker accepts every record kvscope can produce, so that test goes through a
fault injector that refuses writes on demand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from kvscope.publisher import KafkaPublisher, SourcePublisher
from kvscope.schemas import BlockStored, Gap, KVEventBatch, Source
from support.publisher_readback import consume, covered_seqs, dropped

N = 12
SHAPES = [(0,), (3, 7), (10, 11)]
"""Which of the N records are lost: the first one, two apart, two adjacent."""


def good(i: int) -> KVEventBatch:
    """A batch any publisher delivers."""
    return KVEventBatch(ts=1_700_000_000.0 + i, events=[BlockStored(block_hashes=[i + 1])])


def expected_gaps(lost: Sequence[int], reason: str) -> list[tuple[int, int, str]]:
    """The Gaps `lost` must produce: runs of adjacent seqs merged."""
    runs: list[list[int]] = []
    for seq in sorted(lost):
        if runs and runs[-1][1] == seq - 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return [(a, b, reason) for a, b in runs]


def check_losses(
    kafka: KafkaPublisher,
    publisher: SourcePublisher,
    bootstrap_servers: str,
    lost: Sequence[int],
    reason: str,
    drops_before: float,
) -> None:
    """Read kv-events back: the other records arrived, each loss is in a Gap with `reason`."""
    assert kafka.flush(20.0), "the records and the Gaps were not delivered"
    wanted = set(range(publisher.next_seq("kv-events")))
    records = consume(
        bootstrap_servers, [kafka.topic("kv-events")], lambda r: covered_seqs(r) >= wanted
    )
    assert covered_seqs(records) == wanted
    bodies = {r.envelope.seq: r.envelope.body for r in records}
    gaps = sorted(
        (b.first_seq, b.last_seq, b.reason) for b in bodies.values() if isinstance(b, Gap)
    )
    assert gaps == expected_gaps(lost, reason)
    data = sorted(seq for seq, body in bodies.items() if not isinstance(body, Gap))
    assert data == [i for i in range(N) if i not in lost]
    assert all(bodies[i] == good(i) for i in data)
    assert dropped("kv-events", reason) - drops_before == len(lost)


@pytest.mark.parametrize("lost", SHAPES)
def test_a_failing_conversion_in_publish_raw_is_a_convert_error_gap(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    lost: tuple[int, ...],
) -> None:
    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="convert"))
    before = dropped("kv-events", "convert_error")

    def convert(raw: int) -> KVEventBatch:
        if raw in lost:
            raise ValueError(f"cannot convert {raw}")
        return good(raw)

    for i in range(N):
        publisher.publish_raw("kv-events", i, 1_700_000_000.0 + i, convert)
    check_losses(kafka, publisher, bootstrap_servers, lost, "convert_error", before)


@pytest.mark.vllm
@pytest.mark.parametrize("lost", SHAPES)
def test_a_vllm_batch_the_plugin_cannot_convert_is_a_convert_error_gap(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    lost: tuple[int, ...],
) -> None:
    """The vLLM plugin's path: vLLM's own batch through `publish_raw` and its converter."""
    from kvscope.publisher.vllm.convert import kv_batch_from_vllm
    from vllm.distributed import kv_events

    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="vllm-convert"))
    before = dropped("kv-events", "convert_error")
    for i in range(N):
        hashes: list[Any] = ["not a hash"] if i in lost else [i + 1]
        stored = kv_events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium=None,
            lora_name=None,
        )
        batch = kv_events.KVEventBatch(ts=1_700_000_000.0 + i, events=[stored])
        publisher.publish_raw("kv-events", batch, batch.ts, kv_batch_from_vllm)
    check_losses(kafka, publisher, bootstrap_servers, lost, "convert_error", before)


@pytest.mark.parametrize("lost", SHAPES)
def test_a_body_msgpack_cannot_encode_is_an_encode_error_gap(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    lost: tuple[int, ...],
) -> None:
    kafka = make_publisher(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="encode"))
    before = dropped("kv-events", "encode_error")
    for i in range(N):
        if i in lost:  # a hash past 64 bits: msgpack has no such integer
            publisher.publish(KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=[1 << 70])]))
        else:
            publisher.publish(good(i))
    check_losses(kafka, publisher, bootstrap_servers, lost, "encode_error", before)


@pytest.mark.parametrize("lost", SHAPES)
def test_a_record_over_max_request_size_is_a_too_large_gap(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    lost: tuple[int, ...],
) -> None:
    limit = 4_096
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, max_request_size=limit
    )
    publisher = kafka.for_source(Source(instance="large"))
    before = dropped("kv-events", "too_large")
    big = KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=list(range(1, limit)))])
    for i in range(N):
        publisher.publish(big if i in lost else good(i))
    check_losses(kafka, publisher, bootstrap_servers, lost, "too_large", before)


def test_publish_never_waits_for_a_stalled_sender(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    """Structural proof that publish() never blocks: the sender thread is held inside a
    conversion (on an Event) while the caller publishes far more than the queue holds; every
    call returns while the sender is still held, the overflow is counted as queue_full, and
    once released every seq arrives or is named by a Gap."""
    queue_size = 20
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, queue_size=queue_size
    )
    publisher = kafka.for_source(Source(instance="stalled"))
    entered, release = threading.Event(), threading.Event()

    def stall(raw: int) -> KVEventBatch:
        entered.set()
        assert release.wait(60), "the test never released the sender"
        return good(raw)

    before = dropped("kv-events", "queue_full")
    publisher.publish_raw("kv-events", 0, 1_700_000_000.0, stall)
    assert entered.wait(30), "the sender never picked up the first record"
    calls = 10 * queue_size
    for i in range(1, calls + 1):
        publisher.publish(good(i))
    assert not release.is_set() and entered.is_set()
    assert kafka.queue_depth() == queue_size
    assert dropped("kv-events", "queue_full") - before == calls - queue_size
    release.set()

    assert kafka.flush(20.0)
    wanted = set(range(publisher.next_seq("kv-events")))
    records = consume(
        bootstrap_servers, [kafka.topic("kv-events")], lambda r: covered_seqs(r) >= wanted
    )
    assert covered_seqs(records) == wanted
    gaps = [r.envelope.body for r in records if isinstance(r.envelope.body, Gap)]
    assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == [
        (queue_size + 1, calls, "queue_full")
    ]

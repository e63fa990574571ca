"""The loss reason `send_failed`: records the broker refuses for good are counted and named.

The real broker cannot be made to refuse a write on demand, so the publisher talks to
it through `RefusingProxy` (tests/support/refusing_proxy.py), a fault injector that
answers Produce requests with TOPIC_AUTHORIZATION_FAILED while told to and keeps every
record it refused as evidence. Each test: records delivered, then the proxy refuses
while some are published, then accepts again and more are published; reading the real
broker back, for each (source, stream):

- every seq is there exactly once, as a record or inside a Gap (never both);
- exactly one Gap, reason send_failed, names the seqs the proxy refused: the records
  published during the fault and the Gap records the publisher tried while it lasted;
- every record published outside the fault arrived unchanged;
- `kvscope_publisher_dropped_total{reason="send_failed"}` moved by the seqs refused.

Shapes: one record or several while refusing, one source or three, one stream or two.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kvscope.publisher import KafkaPublisher, SourcePublisher
from kvscope.schemas import AnyBody, BlockStored, Gap, KVEventBatch, RequestFinished, Source
from kvscope.schemas import decode as decode_envelope
from support.e2e_support import wait_for
from support.publisher_readback import Record, consume, dropped
from support.refusing_proxy import RefusingProxy

BEFORE = 3
AFTER = 3


@dataclass(frozen=True)
class Shape:
    """How many sources publish, on which streams, and how many records each while refused."""

    sources: int
    streams: tuple[str, ...]
    refused: int


SHAPES = [
    Shape(1, ("kv-events",), 1),
    Shape(1, ("kv-events",), 7),
    Shape(3, ("kv-events",), 4),
    Shape(2, ("kv-events", "requests"), 3),
]


def body(stream: str, source: int, i: int) -> AnyBody:
    """The i-th record of a source on a stream (distinct for every (source, stream, i))."""
    if stream == "requests":
        return RequestFinished(request_id=f"r{source}-{i}", prompt_tokens=i + 1)
    return KVEventBatch(
        ts=1_700_000_000.0 + i, events=[BlockStored(block_hashes=[source * 1000 + i + 1])]
    )


@pytest.fixture
def proxy(bootstrap_servers: str) -> Iterator[RefusingProxy]:
    """A refusing proxy in front of the session broker (forwarding until told to refuse)."""
    injector = RefusingProxy(bootstrap_servers).start()
    yield injector
    injector.stop()


def publish(
    sources: list[SourcePublisher], streams: tuple[str, ...], first: int, count: int
) -> None:
    """Publish records first..first+count-1 on every stream of every source."""
    for number, source in enumerate(sources):
        for stream in streams:
            for i in range(first, first + count):
                source.publish(body(stream, number, i))


def refused_seqs(
    proxy: RefusingProxy, source: SourcePublisher, topic: str
) -> tuple[set[int], set[int]]:
    """Seqs of `source` on `topic` the proxy refused, and which of those were data (not Gaps)."""
    seqs: set[int] = set()
    data: set[int] = set()
    for record in proxy.refused():
        if record.topic != topic or record.key != source.key or record.value is None:
            continue
        envelope = decode_envelope(record.value)
        assert (envelope.source, envelope.epoch) == (source.source, source.epoch)
        seqs.add(envelope.seq)
        if not isinstance(envelope.body, Gap):
            data.add(envelope.seq)
    return seqs, data


def booked_ranges(
    kafka: KafkaPublisher,
    proxy: RefusingProxy,
    sources: list[SourcePublisher],
    streams: tuple[str, ...],
    faulty: set[int],
) -> list[tuple[str, int, int, str]] | None:
    """The loss ledger's pending ranges as (stream, first, last, reason), once every record
    published during the fault was refused and every seq refused so far is booked in it
    (none on its way back to the sender, no Gap attempt in flight); None before that."""
    ranges = kafka.queue.losses.pending()
    for stream in streams:
        for source in sources:
            seqs, data = refused_seqs(proxy, source, kafka.topic(stream))
            mine = [r for r in ranges if r.owner is source and r.stream == stream]
            named = {seq for r in mine for seq in range(r.first, r.last + 1)}
            if data != faulty or named != seqs:
                return None
    return [(r.stream, r.first, r.last, r.reason) for r in ranges]


def one_range_each_once_booked(
    kafka: KafkaPublisher,
    proxy: RefusingProxy,
    sources: list[SourcePublisher],
    streams: tuple[str, ...],
    faulty: set[int],
) -> None:
    """Wait until every refused seq is booked, then: one range per (source, stream).

    Checked on the first complete snapshot: the ledger's bound would merge many
    fragments later on, hiding a split."""
    deadline = time.monotonic() + 60
    while (ranges := booked_ranges(kafka, proxy, sources, streams, faulty)) is None:
        assert time.monotonic() < deadline, "timed out after 60 s: refused seqs not all booked"
        time.sleep(0.005)
    assert len(ranges) == len(sources) * len(streams), f"one range each, not {ranges}"
    assert {reason for *_, reason in ranges} == {"send_failed"}


@pytest.mark.parametrize(
    "shape", SHAPES, ids=lambda s: f"{s.sources}src-{len(s.streams)}streams-{s.refused}"
)
def test_records_the_broker_refuses_are_send_failed_drops_named_by_one_gap(
    proxy: RefusingProxy,
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    shape: Shape,
) -> None:
    kafka = make_publisher(bootstrap_servers=proxy.bootstrap_servers, topic_prefix=topic_prefix)
    sources = [kafka.for_source(Source(instance=f"refused-{n}")) for n in range(shape.sources)]
    publish(sources, shape.streams, 0, BEFORE)
    assert kafka.flush(20.0), "records before the fault were not delivered"
    drops_before = {s: dropped(s, "send_failed") for s in shape.streams}

    proxy.refuse()
    publish(sources, shape.streams, BEFORE, shape.refused)
    faulty = set(range(BEFORE, BEFORE + shape.refused))
    one_range_each_once_booked(kafka, proxy, sources, shape.streams, faulty)
    proxy.accept()
    publish(sources, shape.streams, BEFORE + shape.refused, AFTER)
    assert kafka.flush(20.0), "records or Gaps after the fault were not delivered"

    for stream in shape.streams:
        topic = kafka.topic(stream)
        refused_total = 0
        for number, source in enumerate(sources):
            seqs, data = refused_seqs(proxy, source, topic)
            assert data == faulty, "the proxy refused exactly the records of the fault"
            refused_total += len(seqs)
            check_stream(bootstrap_servers, topic, source, stream, number, seqs, shape.refused)
        assert dropped(stream, "send_failed") - drops_before[stream] == refused_total


def check_stream(
    bootstrap_servers: str,
    topic: str,
    source: SourcePublisher,
    stream: str,
    number: int,
    refused: set[int],
    during_fault: int,
) -> None:
    """The broker holds every seq of (source, stream) once; one Gap names exactly `refused`;
    the records published before and after the fault arrived unchanged, in order."""
    wanted = list(range(source.next_seq(stream)))

    def covered(records: list[Record]) -> list[int]:
        """Seqs of this source present as records or named by its Gaps (repeats kept)."""
        seqs: list[int] = []
        for record in records:
            if record.key != source.key:
                continue
            seqs.append(record.envelope.seq)
            if isinstance(gap := record.envelope.body, Gap):
                seqs += range(gap.first_seq, gap.last_seq + 1)
        return seqs

    records = consume(bootstrap_servers, [topic], lambda r: set(covered(r)) >= set(wanted))
    assert sorted(covered(records)) == wanted, "each seq exactly once, as a record or in a Gap"
    mine = {r.envelope.seq: r.envelope.body for r in records if r.key == source.key}
    gaps = [(b.first_seq, b.last_seq, b.reason) for b in mine.values() if isinstance(b, Gap)]
    assert gaps == [(min(refused), max(refused), "send_failed")]
    assert set(range(min(refused), max(refused) + 1)) == refused, "the Gap names only those"
    arrived = [mine[seq] for seq in sorted(mine) if not isinstance(mine[seq], Gap)]
    after = BEFORE + during_fault
    assert arrived == [
        body(stream, number, i) for i in [*range(BEFORE), *range(after, after + AFTER)]
    ]


def test_a_gap_refused_after_newer_losses_still_makes_one_gap(
    proxy: RefusingProxy,
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
) -> None:
    """The orders that split one outage into several Gaps while the ledger merged a loss
    only with the newest range: a Gap probe taken after newer records of its stream were
    published (sent in one batch with them, or after them while they are in flight) is
    refused with or after them, so its range comes back behind theirs and its own seq
    beyond them. The proxy holds the refusals back until such a probe has taken its seq."""
    kafka = make_publisher(bootstrap_servers=proxy.bootstrap_servers, topic_prefix=topic_prefix)
    source = kafka.for_source(Source(instance="reordered"))
    streams = ("kv-events",)
    publish([source], streams, 0, BEFORE)
    assert kafka.flush(20.0), "records before the fault were not delivered"
    drops_before = dropped("kv-events", "send_failed")

    proxy.refuse()
    publish([source], streams, BEFORE, 1)
    one_range_each_once_booked(kafka, proxy, [source], streams, {BEFORE})
    proxy.hold()
    publish([source], streams, BEFORE + 1, 3)
    topic = kafka.topic("kv-events")
    wait_for(
        lambda: len(refused_seqs(proxy, source, topic)[1]) == 4,
        timeout_s=60,
        what="the newer records in flight (held by the proxy)",
    )
    faulty = refused_seqs(proxy, source, topic)[1]
    wait_for(
        lambda: source.next_seq("kv-events") > max(faulty) + 1,
        timeout_s=60,
        what="a Gap probe taken after the newer records",
    )
    proxy.release()
    one_range_each_once_booked(kafka, proxy, [source], streams, faulty)
    proxy.accept()
    publish([source], streams, BEFORE + 4, AFTER)
    assert kafka.flush(20.0), "records or Gaps after the fault were not delivered"

    seqs, data = refused_seqs(proxy, source, topic)
    assert data == faulty
    check_stream(bootstrap_servers, topic, source, "kv-events", 0, seqs, 4)
    assert dropped("kv-events", "send_failed") - drops_before == len(seqs)

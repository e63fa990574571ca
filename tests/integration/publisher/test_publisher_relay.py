"""Records through a per-host relay (`kvscope relay`, a real subprocess) into the real broker.

The engine-side publisher runs with `relay=ipc://...`: it encodes, the relay produces.
Each test checks the loss accounting end to end: every seq a source issued is in Kafka
or named by a Gap, across a relay that is missing, SIGKILLed, or whose broker stops
answering (SIGSTOP, as test_publisher_outage.py does).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kvscope.local.broker import LocalBroker
from kvscope.publisher import KafkaPublisher, SourcePublisher
from kvscope.schemas import BlockStored, Gap, KVEventBatch, RequestFinished, Source
from support.e2e_support import wait_for
from support.publisher_readback import Record, consume, covered_seqs, dropped
from support.relay_process import RelayProcess

BODIES = {
    "kv-events": lambda i: KVEventBatch(
        ts=time.time(), events=[BlockStored(block_hashes=[i], block_size=16)]
    ),
    "requests": lambda i: RequestFinished(request_id=f"r{i}", prompt_tokens=i),
}


@pytest.fixture
def make_relay(tmp_path: Path) -> Iterator[Callable[..., RelayProcess]]:
    """Relay processes (not started) on this test's socket, with more flags if given;
    stopped after the test."""
    made: list[RelayProcess] = []

    def make(bootstrap_servers: str, *flags: str) -> RelayProcess:
        quick = ("--delivery-timeout", "1", "--linger-ms", "1")
        made.append(RelayProcess(tmp_path, bootstrap_servers, (*quick, *flags)))
        return made[-1]

    yield make
    for relay in made:
        relay.stop()


def relayed(
    make_publisher: Callable[..., KafkaPublisher], relay: RelayProcess, **fields: object
) -> KafkaPublisher:
    """A relay-mode publisher: 5 ms linger, 1 s delivery timeout (an ack is overdue after
    6 s), unless `fields` say otherwise. Its brokers are the relay's business."""
    settings: dict[str, object] = {"delivery_timeout_s": 1.0, "linger_ms": 5.0, **fields}
    return make_publisher(bootstrap_servers="unused.invalid:9092", relay=relay.listen, **settings)


def publish(publisher: SourcePublisher, stream: str, count: int, pace_s: float = 0.0) -> None:
    """Publish `count` bodies of `stream`, `pace_s` apart."""
    for i in range(count):
        publisher.publish(BODIES[stream](i))  # type: ignore[no-untyped-call]
        if pace_s:
            time.sleep(pace_s)


def read_back(
    bootstrap_servers: str, kafka: KafkaPublisher, publisher: SourcePublisher, stream: str
) -> list[Record]:
    """`stream`'s records of `publisher`, read until every seq it issued is covered."""
    wanted = set(range(publisher.next_seq(stream)))
    key = publisher.key

    def mine(records: list[Record]) -> list[Record]:
        return [r for r in records if r.key == key and r.envelope.epoch == publisher.epoch]

    records = consume(
        bootstrap_servers, [kafka.topic(stream)], lambda r: covered_seqs(mine(r)) >= wanted
    )
    return mine(records)


def split(records: list[Record]) -> tuple[Counter[int], list[Gap], set[int]]:
    """Stored seqs (how often each), the Gap bodies, and every seq a Gap names or takes."""
    stored: Counter[int] = Counter()
    gaps: list[Gap] = []
    named: set[int] = set()
    for record in records:
        body, seq = record.envelope.body, record.envelope.seq
        if isinstance(body, Gap):
            gaps.append(body)
            named.update(range(body.first_seq, body.last_seq + 1), [seq])
        else:
            stored[seq] += 1
    return stored, gaps, named


@pytest.mark.parametrize(
    ("sources", "streams", "count"),
    [(1, ("kv-events",), 40), (3, ("kv-events", "requests"), 300), (2, ("kv-events",), 6000)],
)
def test_relayed_records_arrive_exactly_once_in_order(
    broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
    sources: int,
    streams: tuple[str, ...],
    count: int,
) -> None:
    relay = make_relay(broker.bootstrap_servers).start()
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix, queue_size=20_000)
    publishers = [kafka.for_source(Source(instance=f"s{n}")) for n in range(sources)]
    for stream in streams:
        for publisher in publishers:
            publish(publisher, stream, count)
    assert kafka.flush(30.0)
    for stream in streams:
        for publisher in publishers:
            records = read_back(broker.bootstrap_servers, kafka, publisher, stream)
            seqs = [r.envelope.seq for r in records]
            assert seqs == list(range(count)), "each seq once, in order, no Gap"
    assert relay.stop() == 0


def test_no_relay_then_started_losses_come_back_as_gaps(
    broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
) -> None:
    relay = make_relay(broker.bootstrap_servers)
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="early"))
    before = dropped("kv-events", "relay_unavailable")
    publish(publisher, "kv-events", 25)
    wait_for(lambda: dropped("kv-events", "relay_unavailable") - before >= 25, timeout_s=30)
    assert not kafka.flush(0.2), "the losses wait for a relay"

    relay.start()
    wait_for(lambda: kafka.flush(1.0), timeout_s=30)  # the Gaps go at the next probe (1 s)
    publish(publisher, "kv-events", 25)
    assert kafka.flush(15.0)
    stored, gaps, named = split(read_back(broker.bootstrap_servers, kafka, publisher, "kv-events"))
    assert {g.reason for g in gaps} == {"relay_unavailable"}
    assert named >= set(range(25))
    issued = publisher.next_seq("kv-events")
    assert set(stored) == set(range(issued - 25, issued)) and set(stored.values()) == {1}


@pytest.mark.parametrize("count", [6, 40])
def test_a_full_relay_refuses_and_the_gap_names_exactly_those(
    broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
    count: int,
) -> None:
    """A relay that takes at most 5 records in flight refuses a larger batch at once."""
    relay = make_relay(broker.bootstrap_servers, "--max-inflight-records", "5").start()
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix, linger_ms=300.0)
    publisher = kafka.for_source(Source(instance="full"))
    before = dropped("kv-events", "relay_full")
    publish(publisher, "kv-events", count)  # one round, one batch of `count` records
    wait_for(lambda: kafka.flush(1.0), timeout_s=30)
    assert dropped("kv-events", "relay_full") - before == count
    stored, gaps, _ = split(read_back(broker.bootstrap_servers, kafka, publisher, "kv-events"))
    assert stored == Counter()
    assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == [(0, count - 1, "relay_full")]


def test_relay_killed_and_restarted_every_seq_is_accounted(
    broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
) -> None:
    relay = make_relay(broker.bootstrap_servers).start()
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="crash"))
    publish(publisher, "kv-events", 100, pace_s=0.002)
    relay.kill()
    publish(publisher, "kv-events", 100, pace_s=0.002)  # to a dead relay
    relay.start()
    wait_for(lambda: kafka.flush(1.0), timeout_s=30)
    publish(publisher, "kv-events", 50)
    assert kafka.flush(15.0)

    stored, gaps, named = split(read_back(broker.bootstrap_servers, kafka, publisher, "kv-events"))
    issued = publisher.next_seq("kv-events")
    assert set(stored) | named == set(range(issued)), "every seq stored or named by a Gap"
    assert set(stored.values()) == {1}
    assert "relay_unavailable" in {g.reason for g in gaps}
    assert set(range(issued - 50, issued)) <= set(stored), "delivery resumed after the restart"


def test_broker_paused_under_the_relay_losses_are_acked_back(
    own_broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
) -> None:
    """SIGSTOP freezes the relay's broker: the relay's produce requests time out (1 s) and
    it acks the records lost; after SIGCONT the engine side's Gaps name them."""
    own_broker.start()
    relay = make_relay(own_broker.bootstrap_servers).start()
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="paused"))
    publish(publisher, "kv-events", 20)
    assert kafka.flush(15.0)
    paused_at = publisher.next_seq("kv-events")
    before = dropped("kv-events", "broker_unavailable")
    pid = own_broker._process.pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    try:
        publish(publisher, "kv-events", 100, pace_s=0.005)
        wait_for(lambda: dropped("kv-events", "broker_unavailable") > before, timeout_s=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    publish(publisher, "kv-events", 20)
    wait_for(lambda: kafka.flush(1.0), timeout_s=30)

    _, gaps, _ = split(read_back(own_broker.bootstrap_servers, kafka, publisher, "kv-events"))
    assert gaps, "the pause must have cost records"
    assert all(g.first_seq >= paused_at for g in gaps)
    assert {g.reason for g in gaps} <= {"broker_unavailable", "relay_unavailable"}
    assert "broker_unavailable" in {g.reason for g in gaps}


def test_a_forked_child_sends_through_the_relay_on_its_own_socket(
    broker: LocalBroker,
    make_relay: Callable[..., RelayProcess],
    make_publisher: Callable[..., KafkaPublisher],
    topic_prefix: str,
) -> None:
    """After a fork the child starts its own sender thread and ZMQ context (the parent's
    do not survive a fork): a new epoch, seqs from 0, every record once; the parent's
    stream goes on untouched."""
    relay = make_relay(broker.bootstrap_servers).start()
    kafka = relayed(make_publisher, relay, topic_prefix=topic_prefix)
    publisher = kafka.for_source(Source(instance="fork"))
    publish(publisher, "requests", 5)
    assert kafka.flush(15.0)
    pid = os.fork()
    if pid == 0:  # the child: publish, deliver, exit without running pytest's teardown
        ok = False
        try:
            publish(publisher, "requests", 20)
            ok = kafka.flush(20.0) and publisher.next_seq("requests") == 20
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(waited[1]) == 0, "the child could not deliver"
    publish(publisher, "requests", 5)
    assert kafka.flush(15.0)
    records = consume(broker.bootstrap_servers, [kafka.topic("requests")], lambda r: len(r) >= 30)
    by_epoch: dict[int, list[int]] = {}
    for record in records:
        by_epoch.setdefault(record.envelope.epoch, []).append(record.envelope.seq)
    assert by_epoch.pop(publisher.epoch) == list(range(10))
    assert list(by_epoch.values()) == [list(range(20))]


@pytest.mark.parametrize(
    ("listen", "needle"),
    [
        ("tcp://0.0.0.0:5999", "is not a loopback address"),
        ("udp://127.0.0.1:5999", "use ipc:///PATH or tcp://HOST:PORT"),
        ("ipc:///nonexistent-kvscope-dir/relay.sock", "cannot listen on"),
        ("in use", "Address already in use"),
    ],
)
def test_bad_listen_addresses_are_one_line_errors(
    broker: LocalBroker, listen: str, needle: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if listen == "in use":
            listen = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [
                *(sys.executable, "-m", "kvscope.cli", "relay", "--listen", listen),
                *("--bootstrap-servers", broker.bootstrap_servers),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert needle in result.stderr and result.stderr.count("\n") == 1

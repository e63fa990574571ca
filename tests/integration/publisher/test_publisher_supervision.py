"""The sender's wake policy, its supervision and fork safety, against the real local broker.

- An idle publisher never wakes its sender; the first record after a quiet spell and a
  full batch do (records go out without `flush()`).
- A sender loop that fails, or a sender thread that is gone, is started again and
  counted; every seq still arrives or is named by a Gap.
- A forked child that publishes gets a working publisher (a new epoch, seqs from 0) even
  when another thread held the publisher's locks at the fork.

Fault injection (the real components cannot fail on demand): a loop failure is a
`RuntimeError` raised once from the sender's idle wait, a dead thread is a sender whose
thread body returns at once, and the held locks are real locks held by a helper thread
across `os.fork()`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import pytest
from kvscope.publisher import KafkaPublisher
from kvscope.publisher.sender import Sender
from kvscope.schemas import Gap, RequestFinished, Source, topic_for
from prometheus_client import REGISTRY
from support.publisher_readback import Record, consume, covered_seqs


def request(i: int) -> RequestFinished:
    return RequestFinished(request_id=f"r{i}", prompt_tokens=i)


def restarts() -> float:
    return REGISTRY.get_sample_value("kvscope_publisher_sender_restarts_total") or 0.0


def published(stream: str = "requests") -> float:
    value = REGISTRY.get_sample_value("kvscope_publisher_published_total", {"stream": stream})
    return value or 0.0


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def read_requests(bootstrap: str, prefix: str, count: int) -> list[Record]:
    """Records of the requests topic until seqs 0..count-1 of one epoch are all accounted for."""

    def done(records: list[Record]) -> bool:
        epochs = {r.envelope.epoch for r in records}
        return any(
            covered_seqs([r for r in records if r.envelope.epoch == e]) >= set(range(count))
            for e in epochs
        )

    return consume(bootstrap, [topic_for("requests", prefix)], done)


def test_an_idle_sender_sleeps_until_the_next_record(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=5
    )
    source = kafka.for_source(Source(instance="idle:1"))
    source.publish(request(0))
    assert kafka.flush(10.0)
    assert wait_until(lambda: kafka.queue.armed), "after an empty round the sender arms"
    rounds = kafka.sender_rounds()
    time.sleep(0.3)  # 60 lingers: a timer-driven sender would have woken ~60 times
    assert kafka.sender_rounds() == rounds, "an idle sender must not wake"
    before = published()
    for i in range(1, 4):
        source.publish(request(i))
    assert wait_until(lambda: published() >= before + 3), "the first record wakes it (no flush)"
    records = read_requests(bootstrap_servers, topic_prefix, 4)
    assert [r.envelope.seq for r in records] == [0, 1, 2, 3]


@pytest.mark.parametrize("capacity", [8, 40, 400])
def test_a_full_batch_is_sent_without_waiting_for_the_linger(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    capacity: int,
) -> None:
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=topic_prefix,
        linger_ms=60_000,  # the longest allowed: far beyond the wait below
        queue_size=capacity,
    )
    source = kafka.for_source(Source(instance=f"full:{capacity}"))
    before = published()
    for i in range(kafka.queue.full_at):
        source.publish(request(i))
    assert wait_until(lambda: published() >= before + kafka.queue.full_at)
    assert len(kafka.queue) == 0


def test_a_failed_sender_loop_is_restarted_and_loses_nothing_silently(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = []
    real_idle = Sender._idle_until_work

    async def fail_once(self: Sender) -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("injected: the sender loop fails")
        await real_idle(self)

    monkeypatch.setattr(Sender, "_idle_until_work", fail_once)
    real_close = Sender._close_producer

    async def slow_close(self: Sender) -> None:
        # Fault injection (a fake by necessity: a failing loop's cleanup cannot be slowed on
        # demand): the failed loop takes its time to close its producer, so the flush below
        # reaches it while it still runs, before the next loop replaces it (CI once hit
        # that window by chance: the flush then waited for a loop that never ran it).
        if failures:
            await asyncio.sleep(0.5)
        await real_close(self)

    monkeypatch.setattr(Sender, "_close_producer", slow_close)
    before = restarts()
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=5
    )
    source = kafka.for_source(Source(instance="crash:1"))
    source.publish(request(0))
    assert wait_until(lambda: bool(failures) and restarts() == before + 1)
    for i in range(1, 30):
        source.publish(request(i))
    assert kafka.flush(20.0)
    assert kafka.sender_alive()
    records = read_requests(bootstrap_servers, topic_prefix, 30)
    assert covered_seqs(records) >= set(range(30))
    assert source.next_seq("requests") - 1 == max(r.envelope.seq for r in records)


@pytest.mark.parametrize("trigger", ["queue_full", "flush"])
def test_a_dead_sender_thread_is_restarted(
    make_publisher: Callable[..., KafkaPublisher],
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    trigger: str,
) -> None:
    monkeypatch.setattr(Sender, "run_forever", lambda self: None)  # injected: the thread ends
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, queue_size=20
    )
    assert wait_until(lambda: not kafka.sender_alive())
    monkeypatch.undo()
    before = restarts()
    source = kafka.for_source(Source(instance=f"dead:{trigger}"))
    count = 25 if trigger == "queue_full" else 10
    for i in range(count):
        source.publish(request(i))
    if trigger == "flush":
        assert kafka.flush(20.0)
    assert kafka.sender_alive(), f"{trigger} must start the sender again"
    assert restarts() == before + 1
    assert kafka.flush(20.0)
    records = read_requests(bootstrap_servers, topic_prefix, count)
    seqs = [r.envelope.seq for r in records]
    assert covered_seqs(records) >= set(range(count)) and len(seqs) == len(set(seqs))
    gaps = [r.envelope.body for r in records if isinstance(r.envelope.body, Gap)]
    if trigger == "queue_full":
        assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == [(20, 24, "queue_full")]


def _hold(locks: list[threading.Lock], held: threading.Event, release: threading.Event) -> None:
    for lock in locks:
        lock.acquire()
    held.set()
    release.wait()
    for lock in locks:
        lock.release()


def test_a_forked_child_publishes_with_a_fresh_publisher_even_if_locks_were_held(
    make_publisher: Callable[..., KafkaPublisher], bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = make_publisher(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=5
    )
    source = kafka.for_source(Source(instance="fork:1"))
    for i in range(5):
        source.publish(request(i))
    assert kafka.flush(10.0)
    counter = kafka.metrics.published.labels(stream="requests")
    held, release = threading.Event(), threading.Event()
    locks = [source._lock, kafka.queue.losses._lock, counter._value._lock]
    holder = threading.Thread(target=_hold, args=(locks, held, release))
    holder.start()
    assert held.wait(5.0)
    pid = os.fork()
    if pid == 0:  # the child: publish, deliver, exit without running pytest's teardown
        ok = False
        try:
            for i in range(100, 120):
                source.publish(request(i))
            ok = kafka.flush(20.0) and source.next_seq("requests") == 20
        finally:
            os._exit(0 if ok else 1)
    release.set()
    holder.join()
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked child hung (a lock held at the fork?)")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(waited[1]) == 0, "the child could not deliver"
    for i in range(5, 10):
        source.publish(request(i))
    assert kafka.flush(10.0)
    records = consume(
        bootstrap_servers, [topic_for("requests", topic_prefix)], lambda r: len(r) >= 30
    )
    by_epoch: dict[int, list[int]] = {}
    for record in records:
        by_epoch.setdefault(record.envelope.epoch, []).append(record.envelope.seq)
    assert by_epoch[source.epoch] == list(range(10)), "the parent's records are untouched"
    child = [seqs for epoch, seqs in by_epoch.items() if epoch != source.epoch]
    assert child == [list(range(20))], "the child: a new epoch, seqs from 0, each once"
    child_ids = sorted(
        int(r.envelope.body.request_id[1:]) for r in records if r.envelope.epoch != source.epoch
    )
    assert child_ids == list(range(100, 120))

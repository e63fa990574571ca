"""TransferTimer: only time inside the transfer stack counts; one record per request."""

from __future__ import annotations

import threading

import pytest
from kvscope.publisher import Publisher, TransferTimer
from kvscope.schemas import KVTransfer
from prometheus_client import REGISTRY


class Recorder(Publisher):
    """Keeps published bodies in memory (a recording sink standing in for Kafka)."""

    def __init__(self) -> None:
        self.bodies: list[KVTransfer] = []

    def publish(self, body, ts=None):  # type: ignore[no-untyped-def]
        self.bodies.append(body)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        pass


class Clock:
    """A settable clock: the test decides how much time passes inside and outside the stack."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(backend: str = "test") -> tuple[TransferTimer, Recorder, Clock]:
    recorder, clock = Recorder(), Clock()
    timer = TransferTimer(
        recorder,
        backend=backend,
        src_instance="prefill-0",
        dst_instance="decode-0",
        clock=clock,
        wall_clock=clock,
    )
    return timer, recorder, clock


def test_time_between_chunks_is_not_counted() -> None:
    timer, recorder, clock = make()
    timer.begin("r1", 0, expected_chunks=2)
    clock.now += 0.010
    timer.end("r1", 0, bytes=1000, blocks=2)
    clock.now += 5.0  # waiting in the scheduler, outside the transfer stack
    timer.begin("r1", 1)
    clock.now += 0.030
    assert recorder.bodies == []
    timer.end("r1", 1, bytes=500, blocks=1)
    [record] = recorder.bodies
    assert record.latency_s == pytest.approx(0.040)
    assert (record.request_id, record.chunks, record.bytes, record.blocks) == ("r1", 2, 1500, 3)
    assert (record.src_instance, record.dst_instance, record.backend) == (
        "prefill-0",
        "decode-0",
        "test",
    )
    assert (record.start_ts, record.end_ts, record.status) == (100.0, pytest.approx(105.04), "ok")
    assert timer.pending() == 0


def test_overlapping_chunks_count_once() -> None:
    timer, recorder, clock = make()
    timer.begin("r", "a")
    clock.now += 0.010
    timer.begin("r", "b")
    clock.now += 0.010
    timer.end("r", "a")
    clock.now += 0.010
    timer.end("r", "b", last=True)
    assert [(b.latency_s, b.chunks) for b in recorder.bodies] == [(pytest.approx(0.030), 2)]


def test_fail_reports_what_was_measured_with_its_status() -> None:
    timer, recorder, clock = make()
    timer.begin("r", 0)
    clock.now += 0.5
    timer.fail("r", "aborted")
    timer.fail("r")  # already reported: nothing more
    timer.end("r", 0)
    [record] = recorder.bodies
    assert (record.status, record.latency_s, record.chunks) == ("aborted", 0.5, 0)


def test_unknown_or_unopened_chunks_are_ignored() -> None:
    timer, recorder, _ = make()
    timer.end("never-began", 0, last=True)
    timer.begin("r", 0)
    timer.end("r", 7, last=True)
    assert recorder.bodies == []
    assert timer.pending() == 1


def test_pending_requests_are_bounded() -> None:
    recorder, clock = Recorder(), Clock()
    timer = TransferTimer(recorder, backend="b", max_pending=2, clock=clock, wall_clock=clock)
    for request in ("r1", "r2", "r3"):
        timer.begin(request)
    assert [(b.request_id, b.status) for b in recorder.bodies] == [("r1", "aborted")]
    assert timer.pending() == 2


def test_latency_histogram_is_observed_per_backend_status_and_pair() -> None:
    timer, _, clock = make(backend="hist-test")
    labels = {
        "backend": "hist-test",
        "status": "ok",
        "src_instance": "prefill-0",
        "dst_instance": "decode-0",
    }
    timer.begin("r")
    clock.now += 0.002
    timer.end("r", last=True)
    count = REGISTRY.get_sample_value("kvscope_kv_transfer_latency_seconds_count", labels)
    total = REGISTRY.get_sample_value("kvscope_kv_transfer_latency_seconds_sum", labels)
    assert count == 1
    assert abs(total - 0.002) < 1e-9
    make(backend="hist-test")  # a second timer reuses the registered histogram


def test_concurrent_chunks_from_many_threads_give_one_record_per_request() -> None:
    recorder = Recorder()
    timer = TransferTimer(recorder, backend="threads")

    def transfer(request: str) -> None:
        for chunk in range(20):
            timer.begin(request, chunk, expected_chunks=20)
            timer.end(request, chunk, bytes=10)

    threads = [threading.Thread(target=transfer, args=(f"r{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(b.request_id for b in recorder.bodies) == [f"r{i}" for i in range(8)]
    assert {(b.chunks, b.bytes) for b in recorder.bodies} == {(20, 200)}

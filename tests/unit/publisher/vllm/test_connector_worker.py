"""The timing connector's bookkeeping: request ids, peers, block counts, load outcomes."""

from __future__ import annotations

import pytest
from kvscope.publisher import TransferTimer
from kvscope.publisher.vllm.connector.plans import (
    PEER_INSTANCE_KEY,
    LoadPlan,
    blocks_loaded,
    external_request_id,
    peer_instance,
)
from kvscope.publisher.vllm.connector.worker import LoadTracker
from support.recording import Clock, Recorder


def tracker() -> tuple[LoadTracker, Recorder, Clock]:
    recorder, clock = Recorder(), Clock(10.0)
    timer = TransferTimer(recorder, backend="nixl", clock=clock, wall_clock=clock)
    return LoadTracker(timer), recorder, clock


def plan(n: int, blocks: int = 2, block_ids: tuple[int, ...] = ()) -> LoadPlan:
    return LoadPlan(
        internal_id=f"cmpl-r{n}-0-0a1b2c3d",
        request_id=f"cmpl-r{n}-0",
        src_instance="prefill:8100",
        dst_instance="decode:8200",
        blocks=blocks,
        bytes=blocks * 32768,
        block_ids=block_ids or tuple(range(10 * n, 10 * n + blocks)),
    )


@pytest.mark.parametrize(
    ("internal", "external"),
    [
        ("cmpl-abc-0-0a1b2c3d", "cmpl-abc-0"),
        ("cmpl-abc-0", "cmpl-abc-0"),  # randomization disabled: nothing to strip
        ("chatcmpl-x-ffffffff", "chatcmpl-x"),
        ("cmpl-abc-0-0A1B2C3D", "cmpl-abc-0-0A1B2C3D"),  # vLLM's suffix is lower-case hex
    ],
)
def test_external_request_id_strips_only_vllms_suffix(internal: str, external: str) -> None:
    assert external_request_id(internal) == external


def test_peer_prefers_the_kvscope_instance_over_the_engine_id() -> None:
    params = {"remote_engine_id": "prefill-0", PEER_INSTANCE_KEY: "host:8100"}
    assert peer_instance(params) == "host:8100"
    assert peer_instance({"remote_engine_id": "prefill-0"}) == "prefill-0"
    assert peer_instance({}) == ""


@pytest.mark.parametrize(
    ("local", "external", "size", "expected"),
    [
        (0, 64, 32, 2),
        (0, 70, 32, 3),
        (32, 64, 32, 2),
        (32, 65, 32, 3),
        (0, 1, 16, 1),
        (0, 0, 32, 0),
    ],
)
def test_blocks_loaded_counts_the_blocks_the_tokens_fill(
    local: int, external: int, size: int, expected: int
) -> None:
    assert blocks_loaded(local, external, size) == expected


@pytest.mark.parametrize("loads", [1, 3, 8])
def test_each_received_load_publishes_one_record_with_its_latency(loads: int) -> None:
    track, recorder, clock = tracker()
    plans = [plan(i, blocks=i + 1) for i in range(loads)]
    track.started(plans)
    for i, p in enumerate(plans):
        clock.now += 0.01 * (i + 1)
        track.finished({p.internal_id}, set())
        track.load_errors(set())
    assert [(r.request_id, r.blocks, r.bytes, r.status) for r in recorder.bodies] == [
        (p.request_id, p.blocks, p.bytes, "ok") for p in plans
    ]
    # Each load started at 10.0; the i-th is received after the first i+1 increments.
    expected = [sum(0.01 * (k + 1) for k in range(i + 1)) for i in range(loads)]
    assert [r.latency_s for r in recorder.bodies] == pytest.approx(expected)
    assert all(
        r.src_instance == "prefill:8100" and r.dst_instance == "decode:8200"
        for r in recorder.bodies
    )
    assert track.pending() == 0


def test_failed_receive_and_load_errors_publish_failed_records() -> None:
    track, recorder, clock = tracker()
    failed, broken, fine = plan(1), plan(2, block_ids=(7, 8)), plan(3, block_ids=(5, 6))
    track.started([failed, broken, fine])
    clock.now += 0.5
    track.finished({failed.internal_id, broken.internal_id, fine.internal_id}, {failed.internal_id})
    track.load_errors({8})
    statuses = {r.request_id: r.status for r in recorder.bodies}
    assert statuses == {
        failed.request_id: "failed",
        broken.request_id: "failed",
        fine.request_id: "ok",
    }


def test_a_load_started_twice_is_timed_once_and_unknown_ids_are_ignored() -> None:
    track, recorder, clock = tracker()
    p = plan(1)
    track.started([p])
    clock.now += 1.0
    track.started([p])
    clock.now += 1.0
    track.finished({p.internal_id, "cmpl-other-0-deadbeef"}, set())
    track.load_errors(set())
    assert [(r.request_id, r.latency_s) for r in recorder.bodies] == [(p.request_id, 2.0)]


def test_loads_landed_without_a_load_error_call_settle_at_the_next_step() -> None:
    track, recorder, _ = tracker()
    first, second = plan(1), plan(2)
    track.started([first, second])
    track.finished({first.internal_id}, set())
    assert recorder.bodies == []
    track.finished({second.internal_id}, set())
    assert [r.request_id for r in recorder.bodies] == [first.request_id]
    track.load_errors(set())
    assert [r.request_id for r in recorder.bodies] == [first.request_id, second.request_id]

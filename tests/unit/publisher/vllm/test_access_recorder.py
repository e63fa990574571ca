"""The access stream's recorder alone: admissions and releases become `BlockAccess` bodies.

Requests are plain stand-ins with the attributes vLLM's `Request` gives the recorder
(request_id, num_preemptions, num_prompt_tokens, num_computed_tokens, block_hashes,
arrival_time, session_id, cache_salt); the real scheduler is exercised in
tests/vllm/test_vllm_access_stream.py.
"""

from __future__ import annotations

import hashlib
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kvscope.publisher.vllm.accesses import AccessRecorder, attach, unsupported_reason
from kvscope.schemas import BlockAccess
from kvscope.schemas.engines import normalize_hash
from support.recording import Recorder


def _request(request_id: str, prompt: int, blocks: int, **extra: Any) -> Any:
    """A finished request with `blocks` block hashes, all of them computed unless
    `num_computed_tokens` says otherwise."""
    hashes = [hashlib.sha256(f"{request_id}{i}".encode()).digest() for i in range(blocks)]
    fields = {
        "num_computed_tokens": 10**6,
        "num_preemptions": 0,
        "arrival_time": 1_700_000_000.5,
        "session_id": None,
        "cache_salt": None,
    }
    return SimpleNamespace(
        request_id=request_id, num_prompt_tokens=prompt, block_hashes=hashes, **{**fields, **extra}
    )


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("hit_blocks", [0, 1, 3])
def test_an_admitted_request_releases_one_access(block_size: int, hit_blocks: int) -> None:
    recorder = Recorder()
    accesses = AccessRecorder(recorder, block_size)  # type: ignore[arg-type]
    request = _request("chat-7-0a1b2c3d", 4 * block_size + 1, 5, session_id="s-1")
    accesses.looked_up(request, hit_blocks * block_size)
    assert accesses.pending() == 1
    accesses.released(request, held_blocks=lambda request_id: 6)
    [body] = recorder.bodies
    assert isinstance(body, BlockAccess)
    assert body.request_id == "chat-7", "the id the client sent, as in the requests stream"
    assert (body.prompt_tokens, body.block_size) == (4 * block_size + 1, block_size)
    assert body.block_hashes == [normalize_hash(h) for h in request.block_hashes]
    assert (body.hit_blocks, body.held_blocks, body.session) == (hit_blocks, 6, "s-1")
    assert body.arrival_ts == 1_700_000_000.5 <= body.lookup_ts <= body.free_ts
    assert accesses.pending() == 0


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("output_tokens", [1, 2, 7, 15, 16, 17, 31, 32, 33])
@pytest.mark.parametrize("prompt_blocks", [1, 3])
def test_only_blocks_whose_kv_was_computed_are_published(
    block_size: int, output_tokens: int, prompt_blocks: int
) -> None:
    """vLLM's `block_hashes` cover every token, the last sampled one too, but no step
    computes that token's KV: a block it fills is never cached, so it is not published."""
    recorder = Recorder()
    accesses = AccessRecorder(recorder, block_size)  # type: ignore[arg-type]
    prompt = prompt_blocks * block_size - 3
    total = prompt + output_tokens
    request = _request("r", prompt, total // block_size, num_computed_tokens=total - 1)
    accesses.looked_up(request, 0)
    accesses.released(request, held_blocks=lambda request_id: -(-(total - 1) // block_size))
    [body] = recorder.bodies
    cached = (total - 1) // block_size
    assert body.block_hashes == [normalize_hash(h) for h in request.block_hashes[:cached]]
    assert len(body.block_hashes) == len(request.block_hashes) - (total % block_size == 0)


def test_a_readmission_after_preemption_keeps_the_first_lookup() -> None:
    recorder = Recorder()
    accesses = AccessRecorder(recorder, 16)  # type: ignore[arg-type]
    request = _request("r", 80, 5, cache_salt="salt")
    accesses.looked_up(request, 32)
    request.num_preemptions = 1
    accesses.looked_up(request, 64)
    accesses.released(request, held_blocks=lambda request_id: 5)
    assert [(b.hit_blocks, b.session) for b in recorder.bodies] == [(2, "salt")]


def test_a_request_never_admitted_publishes_nothing() -> None:
    recorder = Recorder()
    accesses = AccessRecorder(recorder, 16)  # type: ignore[arg-type]
    accesses.released(_request("aborted", 40, 2), held_blocks=lambda request_id: 0)
    assert recorder.bodies == []


def test_a_failing_observer_never_raises_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    accesses = AccessRecorder(recorder, 16)  # type: ignore[arg-type]
    broken = SimpleNamespace(request_id="b")  # no num_preemptions, no prompt
    with caplog.at_level(logging.WARNING, logger="kvscope.publisher.vllm.accesses"):
        for _ in range(3):
            accesses.looked_up(broken, 16)
            accesses.looked_up(_request("b", 40, 2), 16)
            accesses.released(broken, held_blocks=lambda request_id: 1)
    assert recorder.bodies == []
    assert len(caplog.records) == 1


@pytest.mark.parametrize("version", ["0.31.9", "0.33.0", "1.0.0", "0.3.2", ""])
def test_other_vllm_versions_are_not_observed(version: str) -> None:
    reason = unsupported_reason(version)
    assert reason is not None and "0.32." in reason


class _Scheduler:
    """The parts of vLLM 0.32's `Scheduler` that `attach` observes, driven the way vLLM
    drives them (the real delayed free runs in tests/vllm/test_pd_nixl_pair.py): `finish`
    is `_free_request` (the id joins `finished_req_ids`, blocks freed unless the connector
    delays it), `step` is `schedule()` handing that set on, `transfer_done` is
    `_update_from_kv_xfer_finished` freeing a delayed request's blocks."""

    def __init__(self) -> None:
        self.req_to_blocks: dict[str, list[int]] = {}
        manager = SimpleNamespace(single_type_managers=[SimpleNamespace(req_to_blocks={})])
        manager.single_type_managers[0].req_to_blocks = self.req_to_blocks
        self.kv_cache_manager = SimpleNamespace(
            record_prefix_cache_stats=lambda request, hits: None, coordinator=manager
        )
        self.finished_req_ids: set[str] = set()
        self.freed: list[str] = []

    def _free_blocks(self, request: Any) -> None:
        self.freed.append(request.request_id)
        del self.req_to_blocks[request.request_id]

    def admit(self, request: Any, blocks: int) -> None:
        self.req_to_blocks[request.request_id] = list(range(blocks))
        self.kv_cache_manager.record_prefix_cache_stats(request, 0)

    def finish(self, request: Any, delay_free: bool) -> None:
        self.finished_req_ids.add(request.request_id)
        if not delay_free:
            self._free_blocks(request)

    def step(self) -> None:
        self.finished_req_ids = set()

    def transfer_done(self, request: Any) -> None:
        self._free_blocks(request)


@pytest.mark.parametrize("steps_until_read", [1, 2, 5])
def test_a_release_the_connector_delayed_is_held_until_free(steps_until_read: int) -> None:
    recorder = Recorder()
    scheduler = _Scheduler()
    attach(scheduler, AccessRecorder(recorder, 16))  # type: ignore[arg-type]
    prefill, local, aborted = (_request(r, 40, 3) for r in ("p", "l", "a"))
    for request in (prefill, local, aborted):
        scheduler.admit(request, 3)
    scheduler.finish(prefill, delay_free=True)  # P/D prefill: KV waits for the decode side
    scheduler.finish(local, delay_free=False)
    for _ in range(steps_until_read):
        scheduler.step()
    scheduler.finish(aborted, delay_free=False)  # finished (aborted) later, freed at once
    scheduler.transfer_done(prefill)
    assert scheduler.freed == ["l", "a", "p"], "vLLM's own free still runs, in order"
    held = {body.request_id: (body.held_until_free, body.held_blocks) for body in recorder.bodies}
    assert held == {"p": (True, 3), "l": (False, 3), "a": (False, 3)}

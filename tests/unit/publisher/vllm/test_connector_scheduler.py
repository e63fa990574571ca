"""The connector's scheduler side alone: `LoadPlanner` turns accepted loads into plans.

Requests and allocated blocks are plain stand-ins with the attributes vLLM's `Request`
and `KVCacheBlocks` give the planner (request_id, kv_transfer_params; blocks,
get_block_ids()); the real ones are exercised in tests/vllm/test_pd_connector_parts.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kvscope.publisher.vllm.connector.plans import PEER_INSTANCE_KEY, LoadPlan
from kvscope.publisher.vllm.connector.scheduler import LoadPlanner


def _request(request_id: str, params: dict[str, Any] | None) -> Any:
    return SimpleNamespace(request_id=request_id, kv_transfer_params=params)


def _blocks(ids: list[int]) -> Any:
    return SimpleNamespace(blocks=[ids], get_block_ids=lambda: (ids,))


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize(("local", "external"), [(0, 1), (0, 64), (16, 48), (33, 100), (5, 0)])
def test_an_accepted_load_becomes_one_plan(block_size: int, local: int, external: int) -> None:
    planner = LoadPlanner("decode-0", block_size, bytes_per_block=1000)
    ids = list(range(100, 100 + (local + external) // block_size + 2))
    planner.matched("req-1-0123abcd", local)
    planner.allocated(
        _request("req-1-0123abcd", {PEER_INSTANCE_KEY: "prefill-3"}), _blocks(ids), external
    )
    plans = planner.take()
    if external == 0:
        assert plans == ()
        return
    (plan,) = plans
    count = -(-(local + external) // block_size) - local // block_size
    first = local // block_size
    assert plan == LoadPlan(
        internal_id="req-1-0123abcd",
        request_id="req-1",
        src_instance="prefill-3",
        dst_instance="decode-0",
        blocks=count,
        bytes=count * 1000,
        block_ids=tuple(ids[first : first + count]),
    )
    assert planner.take() == ()


def test_the_peer_falls_back_to_the_remote_engine_id() -> None:
    planner = LoadPlanner("d", 16, 1)
    planner.allocated(_request("r", {"remote_engine_id": "engine-7"}), _blocks([1, 2]), 20)
    assert planner.take()[0].src_instance == "engine-7"


def test_a_request_that_cannot_be_planned_is_skipped_without_raising() -> None:
    planner = LoadPlanner("d", 16, 1)
    broken = SimpleNamespace(blocks=[[1]], get_block_ids=None)
    planner.allocated(_request("r", {}), broken, 16)
    assert planner.take() == ()


def test_finished_params_name_this_instance_unless_there_is_none() -> None:
    planner = LoadPlanner("prefill-0", 16, 1)
    assert planner.with_instance({"remote_engine_id": "e"}) == {
        "remote_engine_id": "e",
        PEER_INSTANCE_KEY: "prefill-0",
    }
    assert planner.with_instance(None) is None
    assert LoadPlanner("", 16, 1).with_instance({"a": 1}) == {"a": 1}


def test_forget_drops_the_remembered_local_tokens() -> None:
    planner = LoadPlanner("d", 16, 1)
    planner.matched("r", 32)
    planner.forget("r")
    planner.allocated(_request("r", {}), _blocks([5, 6, 7]), 16)
    assert planner.take()[0].block_ids == (5,)

"""Per-request KV-load bookkeeping for the timing connector (no vLLM imports).

The scheduler side of `KvscopeConnector` turns what it sees of a request (its
`kv_transfer_params`, the tokens the inner connector will load, the blocks allocated for
them) into a `LoadPlan`; plans travel to the worker inside the connector metadata, where
`LoadTracker` times each load from the `start_load_kv` that issues it to the
`get_transfer_results` that reports it finished, and publishes one `KVTransfer` per
request through a `TransferTimer` (status failed when the inner connector reports the
receive failed or any of its blocks among the load errors of that step).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from kvscope.publisher.transfer_timer import TransferTimer

log = logging.getLogger(__name__)

WRAPPER_NAME = "KvscopeConnector"
"""The `kv_connector` name of kvscope's timing connector (its class name)."""
PEER_INSTANCE_KEY = "kvscope_instance"
"""The key the prefill side adds to the `kv_transfer_params` it returns: its kvscope instance."""

_VLLM_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def external_request_id(internal_id: str) -> str:
    """The request id the client sent, without the 8 random hex digits vLLM appends.

    vLLM's input processor makes each request id unique by adding `-<8 hex>`
    (`InputProcessor.assign_request_id`); the prefill and the decode engine each add their
    own, so only the external id names the request on both sides.
    """
    return _VLLM_SUFFIX.sub("", internal_id)


def peer_instance(params: Mapping[str, Any]) -> str:
    """The kvscope instance a decode request loads from: the prefill side's own name if its
    wrapper added one to `kv_transfer_params`, else the remote engine id."""
    return str(params.get(PEER_INSTANCE_KEY) or params.get("remote_engine_id") or "")


def is_remote_load(params: Mapping[str, Any] | None) -> bool:
    """Whether these `kv_transfer_params` ask this engine to load KV from a peer."""
    if not params:
        return False
    return bool(params.get("do_remote_prefill") or params.get("remote_engine_id"))


def blocks_loaded(local_tokens: int, external_tokens: int, block_size: int) -> int:
    """Blocks that `external_tokens` tokens after `local_tokens` locally computed ones fill."""
    if external_tokens <= 0 or block_size <= 0:
        return 0
    local_blocks = local_tokens // block_size
    return -(-(local_tokens + external_tokens) // block_size) - local_blocks


class LoadPlan(NamedTuple):
    """One request's KV load as the scheduler planned it (picklable, sent to the workers)."""

    internal_id: str
    request_id: str
    src_instance: str
    dst_instance: str
    blocks: int
    bytes: int
    block_ids: tuple[int, ...] = ()


class LoadTracker:
    """Times planned loads on the worker; never raises into the connector."""

    def __init__(self, timer: TransferTimer) -> None:
        self._timer = timer
        self._plans: dict[str, LoadPlan] = {}
        self._landed: list[LoadPlan] = []

    def started(self, plans: Iterable[LoadPlan]) -> None:
        """These loads were handed to the inner connector's `start_load_kv`."""
        try:
            for plan in plans:
                if plan.internal_id in self._plans:
                    continue
                self._plans[plan.internal_id] = plan
                self._timer.begin(
                    plan.request_id,
                    expected_chunks=1,
                    src_instance=plan.src_instance,
                    dst_instance=plan.dst_instance,
                )
        except Exception:
            log.warning("kvscope: could not start timing a KV load", exc_info=True)

    def finished(self, recving: Iterable[str], failed: Iterable[str]) -> None:
        """The inner connector reported these receives done (`failed` ⊆ done or not)."""
        try:
            self._settle(set())
            failed = set(failed)
            for internal_id in failed:
                plan = self._plans.pop(internal_id, None)
                if plan is not None:
                    self._timer.fail(plan.request_id)
            for internal_id in set(recving) - failed:
                plan = self._plans.pop(internal_id, None)
                if plan is not None:
                    self._landed.append(plan)
        except Exception:
            log.warning("kvscope: could not finish timing a KV load", exc_info=True)

    def load_errors(self, block_ids: set[int]) -> None:
        """The blocks that failed to load this step: settle the loads reported done."""
        try:
            self._settle(block_ids)
        except Exception:
            log.warning("kvscope: could not settle KV loads", exc_info=True)

    def pending(self) -> int:
        """Loads started and not yet settled."""
        return len(self._plans) + len(self._landed)

    def _settle(self, error_blocks: set[int]) -> None:
        landed, self._landed = self._landed, []
        for plan in landed:
            if error_blocks and not error_blocks.isdisjoint(plan.block_ids):
                self._timer.fail(plan.request_id)
            else:
                self._timer.end(plan.request_id, bytes=plan.bytes, blocks=plan.blocks)

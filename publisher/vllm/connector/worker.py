"""Worker side of `KvscopeConnector`: `LoadTracker` times each planned load from the
`start_load_kv` that issues it to the `get_transfer_results` that reports it finished, and
publishes one `KVTransfer` per request through a `TransferTimer` (status failed when the
inner connector reports the receive failed or any of its blocks among the load errors of
that step). `worker_tracker` builds it on tensor-parallel rank 0, the rank that publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kvscope.publisher.base import Publisher
from kvscope.publisher.transfer_timer import TransferTimer
from kvscope.publisher.vllm.connector.plans import LoadPlan

log = logging.getLogger(__name__)


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


def is_first_tp_rank() -> bool:
    """Whether this worker is tensor-parallel rank 0 (the one that publishes)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return bool(get_tensor_model_parallel_rank() == 0)
    except Exception:
        return True


def worker_tracker(publisher: Publisher, backend: str, instance: str) -> LoadTracker:
    """The tracker of this worker: its loads land on `instance`, from `backend`."""
    return LoadTracker(TransferTimer(publisher, backend=backend, dst_instance=instance))

"""Scheduler side of `KvscopeConnector` (engine-core process): `LoadPlanner` turns a request
whose load the inner connector accepts into a `LoadPlan` for the workers, and names this
kvscope instance in the `kv_transfer_params` the prefill side returns.

A plan holds the peer (the `kvscope_instance` the prefill wrapper put into
`kv_transfer_params`, else `remote_engine_id`), the blocks allocated for the loaded tokens
and their bytes (KV bytes per block from the KV cache config). Plans ride to the workers
inside the connector's metadata. Nothing here raises into vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvscope.publisher.vllm.connector.plans import (
    PEER_INSTANCE_KEY,
    LoadPlan,
    blocks_loaded,
    external_request_id,
    peer_instance,
)

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


class LoadPlanner:
    """The loads planned this scheduler step, and the local tokens each would follow."""

    def __init__(self, instance: str, block_size: int, bytes_per_block: int) -> None:
        self._instance = instance
        self._block_size = block_size
        self._bytes_per_block = bytes_per_block
        self._plans: list[LoadPlan] = []
        self._local_tokens: dict[str, int] = {}

    def matched(self, request_id: str, num_computed_tokens: int) -> None:
        """The scheduler asked for external tokens after `num_computed_tokens` local ones."""
        self._local_tokens[request_id] = num_computed_tokens

    def allocated(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Blocks were allocated; a load of external tokens becomes a plan."""
        local = self._local_tokens.pop(request.request_id, 0)
        if num_external_tokens <= 0:
            return
        try:
            params = request.kv_transfer_params or {}  # the inner one keeps the peer keys
            self._plans.append(self._plan(request, blocks, local, num_external_tokens, params))
        except Exception:
            log.warning("kvscope: could not plan a KV load", exc_info=True)

    def _plan(
        self,
        request: Request,
        blocks: KVCacheBlocks,
        local_tokens: int,
        external_tokens: int,
        params: Mapping[str, Any],
    ) -> LoadPlan:
        count = blocks_loaded(local_tokens, external_tokens, self._block_size)
        first = local_tokens // self._block_size
        group = blocks.get_block_ids()[0] if blocks.blocks else []
        return LoadPlan(
            internal_id=request.request_id,
            request_id=external_request_id(request.request_id),
            src_instance=peer_instance(params),
            dst_instance=self._instance,
            blocks=count,
            bytes=count * self._bytes_per_block,
            block_ids=tuple(group[first : first + count]),
        )

    def take(self) -> tuple[LoadPlan, ...]:
        """The plans of this step (for the connector metadata); starts the next step."""
        plans, self._plans = tuple(self._plans), []
        return plans

    def forget(self, request_id: str) -> None:
        """The request finished: drop what was remembered of it."""
        self._local_tokens.pop(request_id, None)

    def with_instance(self, params: dict[str, Any] | None) -> dict[str, Any] | None:
        """`kv_transfer_params` that also name this kvscope instance (for the decode side)."""
        if params is None or not self._instance:
            return params
        return {**params, PEER_INSTANCE_KEY: self._instance}

"""What both sides of `KvscopeConnector` share: the `LoadPlan` the scheduler side makes and
the worker side times, the names kvscope adds to vLLM's configs and params, and the
request/peer helpers (no vLLM imports)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

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

"""What `KvscopeConnector` adds per KV transfer, against the bare inner connector, same run.

Drives one decode-side transfer at a time through the calls vLLM makes for it, in the
order vLLM makes them (scheduler: `get_num_new_matched_tokens`,
`update_state_after_alloc`, `build_connector_meta`; worker: `bind_connector_metadata`,
`start_load_kv`, `wait_for_save`, `get_transfer_results`,
`get_block_ids_with_load_errors`, `clear_connector_metadata`), with real vLLM objects
(`VllmConfig`, `Request`, `KVCacheBlocks`, `KVCacheConfig` of a 2-layer model) and
either:

- bare: the inner connector called directly;
- wrapped, kvscope off: `KvscopeConnector` (scheduler and worker instances) around the
  same inner connector with no `KVSCOPE_BOOTSTRAP_SERVERS` (timing into `NullPublisher`);
- wrapped: the same, publishing each transfer's `KVTransfer` to a `KafkaPublisher` that
  sends to a real local broker (another process); its sender thread shares the GIL.

The inner connector does no I/O (`NoopConnector` below: it reports each load received in
the same step), so the difference is the wrapper's own cost; a real connector's time
(NIXL: post, poll, notify) would come on top of both. Reported: the process's CPU time
per transfer (all threads, until every record is delivered; CPU rather than wall time,
which on a shared machine measures the scheduler), median of `--rounds` alternating
rounds, and the ratio to bare. Usage:

    python bench/connector_overhead.py [--transfers 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import torch
from kvscope.local.broker import LocalBroker
from vllm.config import CacheConfig, KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

BLOCK_SIZE = 32
PROMPT_TOKENS = 96


class NoopMetadata(KVConnectorMetadata):
    """The loads of one step."""

    def __init__(self, loads: list[str]) -> None:
        self.loads = loads


class NoopConnector(KVConnectorBase_V1):
    """An inner connector without I/O: every accepted load is received in the same step."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._pending: list[str] = []
        self._received: set[str] = set()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return len(request.prompt_token_ids) - num_computed_tokens, True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens:
            self._pending.append(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        loads, self._pending = self._pending, []
        return NoopMetadata(loads)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, NoopMetadata)
        self._received.update(metadata.loads)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        received, self._received = self._received, set()
        return KVConnectorTransferResults(finished_recving=received)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def configs(wrapped: bool) -> tuple[VllmConfig, KVCacheConfig]:
    inner = {"kv_connector": "NoopConnector", "kv_connector_module_path": __name__}
    transfer = (
        KVTransferConfig(
            kv_connector="KvscopeConnector",
            kv_connector_module_path="kvscope.publisher.vllm.connector",
            kv_role="kv_consumer",
            engine_id="decode-0",
            kv_connector_extra_config={"inner": inner},
        )
        if wrapped
        else KVTransferConfig(**inner, kv_role="kv_consumer", engine_id="decode-0")
    )
    vllm_config = VllmConfig(kv_transfer_config=transfer, cache_config=CacheConfig(block_size=32))
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=2, head_size=32, dtype=torch.float32
    )
    kv_cache = KVCacheConfig(
        num_blocks=4096,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["layer.0", "layer.1"], kv_cache_spec=spec)],
    )
    return vllm_config, kv_cache


def make_pair(wrapped: bool) -> tuple[Any, Any]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    vllm_config, kv_cache = configs(wrapped)
    assert vllm_config.kv_transfer_config is not None
    cls = KVConnectorFactory.get_connector_class(vllm_config.kv_transfer_config)
    return (
        cls(vllm_config, KVConnectorRole.SCHEDULER, kv_cache),
        cls(vllm_config, KVConnectorRole.WORKER, kv_cache),
    )


def requests(n: int) -> list[tuple[Request, KVCacheBlocks]]:
    blocks = PROMPT_TOKENS // BLOCK_SIZE
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": "prefill-0",
        "kvscope_instance": "prefill:8100",
    }
    out = []
    for i in range(n):
        request = Request(
            request_id=f"cmpl-bench{i}-0-0a1b2c3d",
            prompt_token_ids=list(range(PROMPT_TOKENS)),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
        )
        request.kv_transfer_params = dict(params)
        out.append((request, KVCacheBlocks(([KVCacheBlock(b) for b in range(blocks)],))))
    return out


MODES = ("bare", "wrapped, kvscope off", "wrapped")


def run(mode: str, transfers: int, bootstrap_servers: str) -> float:
    """Process CPU ns per transfer for `transfers` transfers, one per step, until every
    record is delivered (the publisher's sender thread included)."""
    os.environ["KVSCOPE_BOOTSTRAP_SERVERS"] = bootstrap_servers if mode == "wrapped" else ""
    scheduler, worker = make_pair(mode != "bare")
    work = requests(transfers)
    started = time.process_time_ns()
    for request, blocks in work:
        scheduler.get_num_new_matched_tokens(request, 0)
        scheduler.update_state_after_alloc(request, blocks, PROMPT_TOKENS)
        worker.bind_connector_metadata(scheduler.build_connector_meta(None))
        worker.start_load_kv(None)
        worker.wait_for_save()
        worker.get_transfer_results(set())
        worker.get_block_ids_with_load_errors()
        worker.clear_connector_metadata()
    worker.shutdown()  # delivers what the wrapper queued
    return (time.process_time_ns() - started) / transfers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=20_000, help="per round (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    args = parser.parse_args()
    os.environ["KVSCOPE_TOPIC_PREFIX"] = "bench-connector."
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    with LocalBroker() as broker:
        for round_ in range(args.rounds):
            for mode in MODES[::-1] if round_ % 2 else MODES:
                results[mode].append(run(mode, args.transfers, broker.bootstrap_servers))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, python {platform.python_version()}")
    bare = statistics.median(results["bare"])
    for mode in MODES:
        ns = statistics.median(results[mode])
        print(f"{mode:22s} {ns:8.0f} CPU ns per transfer, +{ns - bare:6.0f} ns, x{ns / bare:.2f}")


if __name__ == "__main__":
    main()

"""vLLM's in-memory stats and KV events -> kvscope bodies (duck-typed: never imports vLLM).

Runs inside the engine: KV event batches are converted on the publisher's sender thread,
stats in vLLM's stat-logger callback. Field names follow vLLM 0.32 (`vllm.distributed.
kv_events`, `vllm.v1.metrics.stats`); unknown event types are skipped, not guessed, and
counted (`kvscope_publisher_unknown_events_total`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from kvscope.common.metrics import counter
from kvscope.schemas import KVEventBatch, KVTransfer, RequestFinished, Role, normalize_event

UNKNOWN_EVENTS = counter(
    "kvscope_publisher_unknown_events",
    "vLLM KV events of a type this kvscope does not know: skipped, the rest of the batch sent",
)


def kv_batch_from_vllm(batch: Any, keep_token_ids: bool = False) -> KVEventBatch:
    """A vLLM `KVEventBatch` (its `ts`, `events`, `data_parallel_rank`) as kvscope's.

    vLLM's first KV-event releases had no `data_parallel_rank` on the batch (None then).
    """
    events = [
        event for raw in batch.events if (event := normalize_event(raw, keep_token_ids)) is not None
    ]
    if len(events) < len(batch.events):
        UNKNOWN_EVENTS.inc(len(batch.events) - len(events))
    rank = getattr(batch, "data_parallel_rank", None)
    return KVEventBatch(ts=batch.ts, events=events, dp_rank=rank)


def request_from_vllm(finished: Any) -> RequestFinished:
    """A vLLM `FinishedRequestStats` as a `RequestFinished`.

    vLLM keeps no per-request TTFT here; `ttft_s` is end-to-end latency minus decode time
    (arrival to first token, as vLLM's own TTFT histogram measures it).
    """
    e2e = max(0.0, float(finished.e2e_latency))
    decode = max(0.0, float(finished.decode_time))
    return RequestFinished(
        request_id=str(finished.request_id or ""),
        prompt_tokens=finished.num_prompt_tokens,
        cached_tokens=finished.num_cached_tokens,
        output_tokens=finished.num_generation_tokens,
        ttft_s=max(0.0, e2e - decode),
        queue_s=max(0.0, float(finished.queued_time)),
        prefill_s=max(0.0, float(finished.prefill_time)),
        decode_s=decode,
        e2e_s=e2e,
        finish_reason=str(finished.finish_reason),
    )


def backend_name(connector: str) -> str:
    """`NixlConnector` -> `nixl`, `MooncakeConnector` -> `mooncake`."""
    name = connector.lower()
    return name.removesuffix("connector") or name


def transfers_from_connector_stats(
    data: Mapping[str, Any],
    backend: str,
    instance: str,
    role: Role,
    now: float | None = None,
) -> Iterator[KVTransfer]:
    """KVTransfer records from a KV connector's stats payload (`kv_connector_stats`).

    Understands the per-transfer columns NIXL and Mooncake report (`transfer_duration`,
    `bytes_transferred`, `num_descriptors`, `num_failed_transfers`) and MultiConnector's
    `{connector name: payload}` nesting. These stats carry no request id or peer: this
    instance is the source on a prefill instance and the destination otherwise.
    """
    if "transfer_duration" not in data:
        for name, nested in data.items():
            if isinstance(nested, Mapping):
                yield from transfers_from_connector_stats(
                    nested, backend_name(name), instance, role, now
                )
        return
    end = time.time() if now is None else now
    src, dst = (instance, "") if role == "prefill" else ("", instance)
    durations = data.get("transfer_duration", [])
    sizes = data.get("bytes_transferred", [])
    descriptors = data.get("num_descriptors", [])
    for i, duration in enumerate(durations):
        latency = max(0.0, float(duration))
        yield KVTransfer(
            request_id="",
            src_instance=src,
            dst_instance=dst,
            backend=backend,
            bytes=int(sizes[i]) if i < len(sizes) else 0,
            blocks=int(descriptors[i]) if i < len(descriptors) else 0,
            chunks=1,
            start_ts=end - latency,
            end_ts=end,
            latency_s=latency,
        )
    for _ in range(int(sum(data.get("num_failed_transfers", [])))):
        yield KVTransfer(
            request_id="",
            src_instance=src,
            dst_instance=dst,
            backend=backend,
            start_ts=end,
            end_ts=end,
            status="failed",
        )

"""The kvscope wire format: msgspec Structs for the Kafka envelope and every body.

Schemas are data. Compatibility rules (msgspec's schema-evolution rules):
adding a field with a default is compatible; removing, renaming or retyping a
field bumps `SCHEMA_VERSION`. Decoders ignore unknown fields, so an older
collector keeps reading records from a newer publisher of the same schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

SCHEMA_VERSION = 1
"""The envelope schema this code writes and the newest it can read."""

UInt64 = Annotated[int, Meta(ge=0)]
"""A block hash, normalized to an unsigned 64-bit int (msgpack caps it at 2**64 - 1)."""
NonNegInt = Annotated[int, Meta(ge=0)]
Role = Literal["prefill", "decode", "both"]
Medium = Literal["GPU", "CPU", "DISK", "EXTERNAL", "UNKNOWN"]
"""Normalized storage tier of a block (engine-specific names are kept raw too)."""


class Source(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Who published a record: one engine instance and data-parallel rank."""

    instance: str
    """Stable name of the engine instance (host:port, pod name, ...)."""
    model: str = ""
    """Served model name."""
    role: Role = "both"
    """prefill, decode, or both (not disaggregated)."""
    dp_rank: NonNegInt = 0
    """Data-parallel rank inside the instance; each rank has its own KV cache."""
    engine: str = "vllm"
    """Engine family: vllm, sglang, simulator, ..."""
    engine_version: str = ""
    """Engine version string, when known."""

    @property
    def key(self) -> str:
        """The Kafka record key: keeps one source's records ordered in one partition."""
        return f"{self.instance}/{self.dp_rank}"


class KVEvent(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    """Base of the three KV-cache events; tagged by class name in field `type`."""


class BlockStored(KVEvent, tag="BlockStored"):
    """Blocks were written to the cache (one event can carry a chain of blocks)."""

    block_hashes: list[UInt64]
    parent_block_hash: UInt64 | None = None
    """Hash of the block before the first one, None at the start of a sequence."""
    block_size: NonNegInt = 0
    """Tokens per block."""
    token_count: NonNegInt = 0
    """Tokens covered by these blocks (kept even when token_ids are not forwarded)."""
    medium: Medium = "GPU"
    medium_raw: str | None = None
    """The engine's own medium name (e.g. SGLang CPU_PINNED) when it had one."""
    lora_id: int | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    """KV-cache group (hybrid models); None when the engine does not say."""
    tier: str | None = None
    """The offloading tier within the medium (vLLM's `locality` and `ownership`, e.g.
    `REMOTE/obj-1`), when the engine names one: two tiers of one medium stay apart."""
    token_ids: list[int] | None = None
    """The tokens themselves; forwarded only on request (they dominate payload size)."""


class BlockRemoved(KVEvent, tag="BlockRemoved"):
    """Blocks were evicted from the cache."""

    block_hashes: list[UInt64]
    medium: Medium = "GPU"
    medium_raw: str | None = None
    group_idx: int | None = None
    tier: str | None = None
    """The offloading tier within the medium, as in `BlockStored.tier`."""


class AllBlocksCleared(KVEvent, tag="AllBlocksCleared"):
    """The whole cache of this source was dropped (e.g. reset_prefix_cache)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class Body(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    """Base of every envelope body; tagged by name in field `type`."""


class KVEventBatch(Body, tag="KVEvents"):
    """One engine step's KV-cache events (stream kv-events)."""

    ts: float
    """Engine timestamp of the batch, seconds since the epoch."""
    events: list[Event]
    dp_rank: NonNegInt | None = None
    """Data-parallel rank the engine put on the batch, when it did."""


class EngineStats(Body, tag="EngineStats"):
    """A periodic snapshot of one engine's scheduler and cache (stream engine-stats).

    Counters named `*_delta` cover the interval since the previous snapshot of the
    same source and epoch, so sums over any time range are meaningful.
    """

    capacity_blocks: NonNegInt
    block_size: NonNegInt
    usage: Annotated[float, Meta(ge=0.0, le=1.0)]
    """Fraction of KV-cache blocks in use."""
    running: NonNegInt = 0
    waiting: NonNegInt = 0
    prefix_queries_delta: NonNegInt = 0
    """Prompt tokens looked up in the prefix cache in this interval."""
    prefix_hits_delta: NonNegInt = 0
    """Of those, tokens found in the cache."""
    preemptions_delta: NonNegInt = 0
    interval_s: Annotated[float, Meta(ge=0.0)] = 0.0


class RequestFinished(Body, tag="Request"):
    """One finished request (stream requests)."""

    request_id: str
    prompt_tokens: NonNegInt
    cached_tokens: NonNegInt = 0
    """Prompt tokens served from the prefix cache (local or transferred)."""
    output_tokens: NonNegInt = 0
    ttft_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    e2e_s: float = 0.0
    finish_reason: str = ""


class KVTransfer(Body, tag="KVTransfer"):
    """One request's KV transfer between a prefill and a decode instance (stream kv-transfers)."""

    request_id: str
    src_instance: str
    dst_instance: str
    backend: str = ""
    """nixl, mooncake, ..."""
    bytes: NonNegInt = 0
    blocks: NonNegInt = 0
    chunks: NonNegInt = 0
    start_ts: float = 0.0
    end_ts: float = 0.0
    latency_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Time spent inside the transfer stack (sum over chunks), seconds."""
    status: Literal["ok", "failed", "aborted"] = "ok"


class Gap(Body, tag="Gap"):
    """The publisher lost records of this stream: seqs first_seq..last_seq (inclusive)."""

    first_seq: NonNegInt
    last_seq: NonNegInt
    reason: str = ""
    """queue_full, broker_unavailable, replay_missing, ..."""


class EngineMetric(Body, tag="EngineMetric"):
    """One engine Prometheus series over one scrape interval (stream engine-histograms).

    Scraped by `kvscope bridge --metrics-url` from an unmodified engine's /metrics. A
    histogram carries per-bucket deltas (not cumulative) for the interval; a counter its
    increase; a gauge its value at the scrape. Counters or buckets that went down (the
    engine restarted) count from zero again.
    """

    metric: str
    """Family name as the engine exposes it, e.g. vllm:nixl_xfer_time_seconds."""
    kind: Literal["histogram", "counter", "gauge"] = "histogram"
    labels: dict[str, str] = {}
    """The series' labels (model_name, engine, ...)."""
    bounds: list[float] = []
    """Finite bucket upper bounds (`le`), ascending; the +Inf bucket is implicit."""
    bucket_deltas: list[NonNegInt] = []
    """Observations per bucket in the interval: len(bounds) + 1 entries, the last for +Inf."""
    sum_delta: float = 0.0
    """Increase of the histogram's sum (in the metric's unit)."""
    count_delta: NonNegInt = 0
    """Observations in the interval (histograms)."""
    value: float = 0.0
    """Counter increase or gauge value."""
    interval_s: Annotated[float, Meta(ge=0.0)] = 0.0
    """Seconds since the previous scrape of this series."""


class BlockAccess(Body, tag="BlockAccess"):
    """One request's use of one source's KV cache (stream kv-accesses; the vLLM plugin and
    the simulator publish it by default).

    Published when the request releases its blocks (finished, or its KV transferred):
    the full-block hashes it looked up and produced, how many leading ones hit, how many
    blocks it held and when. Replayed at other cache sizes, these give the capacity
    what-if exactly, where the KV events alone only show misses (docs/analytics.md).
    """

    request_id: str
    prompt_tokens: NonNegInt
    block_size: NonNegInt
    block_hashes: list[UInt64] = []
    """Hashes of the request's full blocks whose KV was computed (the ones the engine could
    cache): the prompt's first, then generated ones. An engine computes no KV for the last
    token it samples, so that token's block is left out when it is the one that fills it."""
    hit_blocks: NonNegInt = 0
    """Leading prompt blocks found in the prefix cache at the lookup."""
    held_blocks: NonNegInt = 0
    """Blocks the request held when it released them (the last one may be partial)."""
    arrival_ts: float = 0.0
    """When the request reached the engine (queued), seconds since the epoch."""
    lookup_ts: float = 0.0
    """When the scheduler looked its prefix up and allocated its blocks."""
    free_ts: float = 0.0
    """When its blocks went back to the free queue."""
    held_until_free: bool = False
    """True when it left the scheduler at the lookup (a prefill whose KV waited for a transfer)."""
    session: str = ""
    """The request's session id or cache salt, where it has one ("" otherwise)."""


AnyBody = (
    KVEventBatch | EngineStats | RequestFinished | KVTransfer | Gap | EngineMetric | BlockAccess
)


class Envelope(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Every Kafka record value: one msgpack-encoded Envelope.

    `seq` is contiguous per (source, epoch, stream), so any loss shows as a gap;
    `epoch` is a random u64 chosen when the publisher starts (seq restarts then).
    """

    schema: NonNegInt = SCHEMA_VERSION
    source: Source
    epoch: UInt64
    seq: NonNegInt
    ts: float
    """Engine timestamp of the record, seconds since the epoch."""
    body: AnyBody

"""The report's figures as plain data: what the HTML, the Markdown and the JSON all show.

`gather.py` fills these from the SQL queries; the renderers only read them. Every
section carries its `Completeness`, so no figure is shown without saying how much of
the underlying data arrived.
"""

from __future__ import annotations

from datetime import datetime

import msgspec


class Completeness(msgspec.Struct, frozen=True):
    """How much of the data behind a section arrived (share of the sources' seq ranges)."""

    share: float
    """Received records / expected records (1.0 = nothing lost), over the section's sources."""
    sources: int
    """Sources (instance, dp_rank, epoch, stream) the section is built from."""
    missing: int = 0
    """Records known to be lost (seq gaps)."""

    @property
    def label(self) -> str:
        """Human-readable form, e.g. `99.8% complete (3 sources, 12 records missing)`."""
        text = f"{self.share * 100:.1f}% complete ({self.sources} sources"
        if self.missing:
            text += f", {self.missing} records missing"
        return text + ")"


class ReportParams(msgspec.Struct, frozen=True):
    """What the report was asked for (the command-line flags)."""

    since: datetime | None
    until: datetime | None
    model: str | None
    target_hit_rate: float
    transfer_slo_ms: float
    kv_bytes_per_token: int | None = None
    """KV-cache bytes per token (layers × KV heads × head dim × dtype bytes × 2), if known."""
    gpu_gib: float | None = None
    """KV memory per GPU (GiB), to count GPUs; None: not shown."""
    prefill_tokens_per_gpu_s: float | None = None
    """Prefill throughput of one GPU (tokens/s), to turn saved tokens into GPU-seconds."""
    min_transfers: int = 20
    """A pair needs this many transfers before a finding judges it."""
    usd_per_gpu_hour: float | None = None
    """What one GPU costs per hour ($), to price GPUs added and prefill saved; None: not shown."""


class InstanceInfo(msgspec.Struct, frozen=True):
    """One engine instance seen in the data."""

    instance: str
    role: str
    model: str
    capacity_blocks: int
    block_size: int


class FleetSummary(msgspec.Struct, frozen=True):
    """Who was running, for how long, how much data, and the fleet's hit rate."""

    instances: list[InstanceInfo]
    models: list[str]
    roles: dict[str, int]
    """Role -> number of instances."""
    start: datetime | None
    end: datetime | None
    records: dict[str, int]
    """Table -> rows stored in the report's window (block events, stats, requests, transfers)."""
    hit_rate: float | None
    """Token-weighted prefix-cache hit rate of the fleet, each prompt counted once: hits /
    queries of the instances that prefill (roles prefill and both; None: no queries). A
    decode instance looks the prompt up again, but its hits save no prefill compute."""
    completeness: Completeness
    requests: int = 0
    """Requests served, each counted once: in a prefill/decode fleet on the prefill side only."""
    prompt_tokens: int = 0
    """Their prompt tokens (prefill side only in a prefill/decode fleet)."""
    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache on the prefill side (`hit_rate`'s
    denominator)."""
    prefix_hits: int = 0
    """Of those, tokens found cached (`hit_rate`'s numerator)."""
    decode_hit_rate: float | None = None
    """Hit rate of the decode instances of a prefill/decode fleet (None: none): prompt
    blocks a decode instance already held, so fewer to transfer; no prefill saved."""


class TimePoint(msgspec.Struct, frozen=True, array_like=True):
    """One value at one time (array-like in JSON: `[time, value]`)."""

    t: datetime
    value: float


class ChurnPoint(msgspec.Struct, frozen=True, array_like=True):
    """Stores and removals in one time bucket (`[time, stores, removals]`)."""

    t: datetime
    stores: int
    removals: int


class Bucket(msgspec.Struct, frozen=True, array_like=True):
    """A histogram bucket `[lower bound, upper bound, count]`."""

    lo: float
    hi: float
    count: int


class InstanceFigures(msgspec.Struct, frozen=True):
    """Per-instance cache behaviour."""

    instance: str
    role: str
    hit_rate: float | None
    usage: list[TimePoint]
    """KV-cache usage (0..1) over time, from engine stats."""
    residency_s: list[Bucket]
    """How long blocks stayed resident before they left, seconds (power-of-two buckets)."""
    still_resident: int
    """Blocks still resident at the end of the window (not in the histogram)."""
    churn: list[ChurnPoint]
    """Block stores and removals per time bucket."""
    churn_ratio: float | None
    """Removals / stores over the window."""
    completeness: Completeness


class WhatIfPoint(msgspec.Struct, frozen=True, array_like=True):
    """`[extra capacity fraction, extra blocks fleet-wide, predicted hit rate, tokens saved]`."""

    fraction: float
    """Extra KV blocks as a fraction of each instance's current capacity (0.5 = +50%)."""
    extra_blocks: int
    """Extra KV blocks summed over all instances."""
    hit_rate: float
    """Predicted token-weighted hit rate of the fleet with that capacity."""
    tokens_saved: int
    """Prefill tokens the extra hits would have saved in the window."""


class CapacityFigures(msgspec.Struct, frozen=True):
    """The capacity what-if curve (fleet row of `capacity_what_if`) and what it recommends."""

    baseline_hit_rate: float | None
    curve: list[WhatIfPoint]
    target_hit_rate: float
    fraction_for_target: float | None
    """Smallest extra-capacity fraction on the curve that reaches the target (None: none does)."""
    knee_fraction: float | None
    """Point of diminishing returns: beyond it, each extra step adds less than a tenth of the
    average gain per unit of capacity up to there."""
    recommendation: str
    completeness: Completeness
    method: str = "refault-corrected"
    """How the curve was computed (`capacity_what_if`'s `method`)."""
    error_pp: float | None = None
    """Its error range in percentage points."""
    error_basis: str = "simulator"
    """Where that range was measured (`capacity_what_if`'s `error_basis`): `simulator`
    re-runs or `real-engines` (vLLM engines re-run at larger caches)."""
    window_s: float = 0.0
    """Length of the data window, seconds (saved tokens / window_s = tokens per second)."""
    block_size: int = 0
    """Tokens per KV block (largest over the instances)."""
    instances: int = 0
    """Instances the extra capacity is spread over: those that prefill (a decode instance's
    hits save no prefill compute, so the curve leaves decode instances out)."""


class LeverFigures(msgspec.Struct, frozen=True):
    """Routing and memory side by side: fleet hit-rate gains from the access replay."""

    router: float
    """A prefix-aware router at today's capacity (`router_affinity` says which router)."""
    memory_fraction: float
    """Extra capacity per instance for the memory lever (the smallest on the curve that
    matches the router's gain, else the largest on the curve)."""
    memory: float
    """That much more memory with today's routing."""
    both: float
    """Both levers together."""
    routing: str
    """How today's routing looks (`fixed` or `prefix-aware`)."""
    round_robin: float = 0.0
    """A round-robin router at today's capacity."""
    guesser: float = 0.0
    """A guessing prefix router (its own decisions in an LRU of each instance's capacity,
    no evictions seen) at today's capacity; `router - guesser` is what exact routing, on
    kvscope's index, would have added on this traffic."""
    router_affinity: float | None = None
    """The router of every re-routing: None the simulator's (longest prefix within a load
    slack), else `kvscope route`'s scorer at this affinity (real engines' data)."""


class DuplicationRow(msgspec.Struct, frozen=True):
    """Resident block hashes of one (model, role) and how many are held by 2+ instances."""

    model: str
    role: str
    resident_hashes: int
    duplicated_hashes: int
    share: float | None


class RoutingFigures(msgspec.Struct, frozen=True):
    """What a prefix-aware router would change."""

    duplication: list[DuplicationRow]
    """At the end of the window (queries `duplication`)."""
    stores: int
    """Blocks stored in the window (query `routing_opportunity`)."""
    opportunity_blocks: int
    """Of those, blocks another instance of the same model and role held at that moment."""
    opportunity_tokens: int
    hit_rate_gain: float | None
    """Upper bound on the hit rate a prefix-aware router could add, from the KV events alone:
    opportunity tokens / prefix-cache query tokens, both on the prefill side. The report
    shows it only when there is no access stream to replay (`levers`)."""
    completeness: Completeness
    levers: LeverFigures | None = None
    """Router alone, memory alone and both, replayed from the access stream (None: no stream)."""


class PairLatency(msgspec.Struct, frozen=True):
    """KV-transfer latency of one prefill→decode pair over the window (milliseconds)."""

    src: str
    dst: str
    transfers: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    gbps: float | None
    breaches: int
    """Transfers slower than the SLO."""


class LatencyPoint(msgspec.Struct, frozen=True, array_like=True):
    """`[src, dst, time, p50 ms, p99 ms, transfers]`: one pair in one time bucket."""

    src: str
    dst: str
    t: datetime
    p50_ms: float
    p99_ms: float
    transfers: int


class TransferFigures(msgspec.Struct, frozen=True):
    """KV-transfer latency between prefill and decode instances."""

    slo_ms: float
    pairs: list[PairLatency]
    """All pairs, slowest p99 first."""
    timeline: list[LatencyPoint]
    transfers: int
    breaches: int
    completeness: Completeness


class RequestTiming(msgspec.Struct, frozen=True):
    """Request timings of the instances that prefill, from the stored `requests`."""

    requests: int
    timed_requests: int
    """Requests that reported a prefill time (> 0)."""
    prefill_s_per_token: float | None
    """Measured prefill seconds per uncached prompt token (None: no prefill times stored)."""
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None


class PlannerRow(msgspec.Struct, frozen=True):
    """One step of extra KV capacity in a planner's units (None: the input it needs is
    missing: bytes per block, `--gpu-gib`, a prefill throughput, `--usd-per-gpu-hour`)."""

    fraction: float
    """Extra KV capacity per instance that prefills, as a share of its capacity."""
    extra_blocks: int
    hit_rate: float
    """Predicted fleet hit rate (prefill side, each prompt once)."""
    prefill_tokens_saved_per_s: float
    extra_gib_per_instance: float | None
    """The extra GiB of the instance that needs the most (all alike on a uniform fleet)."""
    extra_gib: float | None
    """Fleet-wide."""
    gpus_added: int | None
    """Whole GPUs: the sum over instances of ceil(its extra GiB / `gpu_gib`)."""
    prefill_gpu_hours_saved_per_hour: float | None
    """Prefill compute saved: tokens saved per second / prefill tokens per GPU-second."""
    net_gpus: float | None
    """Prefill GPU-hours saved per hour minus GPUs added (> 0: the memory pays for itself)."""
    usd_per_hour_added: float | None
    usd_per_hour_saved: float | None
    ttft_saved_ms: float | None
    """Mean prefill time saved per request: tokens saved per request × measured prefill
    seconds per token."""
    extra_gib_per_instance_least: float | None = None
    """The smallest instance's extra GiB; `extra_gib_per_instance` is then the largest's
    (instances with different capacities or block sizes need different amounts)."""


class PlannerFigures(msgspec.Struct, frozen=True):
    """The capacity curve in GiB, whole GPUs, GPU-hours, dollars and TTFT."""

    bytes_per_block: int | None
    """KV bytes of one block (None: unknown; the report then speaks in blocks)."""
    bytes_source: str
    """Where `bytes_per_block` comes from: `model-config` (the flags), `kv-transfers` (the
    bytes per block the engines' transfers carried) or `none`."""
    gpu_gib: float | None
    usd_per_gpu_hour: float | None
    prefill_tokens_per_gpu_s: float | None
    prefill_rate_source: str
    """`flag` (--prefill-tokens-per-gpu-s), `measured` (stored request timings, one GPU per
    instance assumed) or `none`."""
    timing: RequestTiming
    rows: list[PlannerRow]
    """Every point of the capacity curve (the HTML and Markdown show every 25%)."""
    recommended: PlannerRow | None
    """The row of the recommendation's capacity (None: no capacity reaches the target)."""


class HalfFigures(msgspec.Struct, frozen=True):
    """The hit rate and the recommendation computed on one half of the window."""

    since: datetime
    until: datetime
    hit_rate: float | None
    fraction_for_target: float | None


class Uncertainty(msgspec.Struct, frozen=True):
    """How far to trust the recommendation."""

    method: str
    error_pp: float | None
    measured_against: str
    """Where the error range was measured."""
    window_s: float
    short_window: bool
    """Shorter than `SHORT_WINDOW_S`: daily patterns are not in it."""
    warm_up_s: float | None
    """Time from the window's start until every instance that prefills first evicted (its
    cache was full), to the end of that churn bucket (`bucket_s`); None: some never did,
    so the window is all warm-up."""
    halves: list[HalfFigures]
    stable: bool | None
    """The two halves recommend the same capacity within one table step (None: no halves)."""
    warnings: list[str]
    """Plain sentences; empty when nothing calls the figures into question."""


class TrendPoint(msgspec.Struct, frozen=True, array_like=True):
    """`[bucket start, requests, prompt tokens, hit rate, decode hit rate]` (each prompt once)."""

    t: datetime
    requests: int
    prompt_tokens: int
    hit_rate: float | None
    decode_hit_rate: float | None


class Trend(msgspec.Struct, frozen=True):
    """The key figures per day (per hour, per 5 minutes for short windows)."""

    bucket_s: int
    unit: str
    points: list[TrendPoint]


class Report(msgspec.Struct, frozen=True):
    """Everything the report shows; serialized as report.json."""

    generated_at: datetime
    params: ReportParams
    since: datetime
    until: datetime
    """The window every query ran on, [since, until): the flags, or the data's first record
    to just after its last. `kvscope query NAME --param since=... --param until=...` with
    these values gives the rows the report shows."""
    bucket_s: int
    """Length of the time buckets of the churn and transfer time series, seconds (whole
    minutes: they read per-minute aggregates)."""
    usage_bucket_s: int
    """Length of the time buckets of the cache-usage series (raw engine stats), seconds."""
    fleet: FleetSummary
    instances: list[InstanceFigures]
    capacity: CapacityFigures
    routing: RoutingFigures
    transfers: TransferFigures
    findings: list[str]
    """The most important findings, most important first (plain sentences)."""
    planner: PlannerFigures | None = None
    """The capacity curve in GiB, GPUs, GPU-hours, dollars and TTFT."""
    uncertainty: Uncertainty | None = None
    trend: Trend | None = None

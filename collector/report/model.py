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
    """Token-weighted prefix-cache hit rate: sum of hits / sum of queries (None: no queries)."""
    completeness: Completeness


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
    """How long blocks stayed resident, seconds (log-spaced buckets)."""
    churn: list[ChurnPoint]
    """Block stores and removals per time bucket."""
    churn_ratio: float | None
    """Removals / stores over the window."""
    completeness: Completeness


class WhatIfPoint(msgspec.Struct, frozen=True, array_like=True):
    """`[extra blocks, predicted hit rate, prefill tokens saved]` on the what-if curve."""

    extra_blocks: int
    hit_rate: float
    tokens_saved: int


class CapacityFigures(msgspec.Struct, frozen=True):
    """The capacity what-if curve and what it recommends."""

    baseline_hit_rate: float | None
    curve: list[WhatIfPoint]
    target_hit_rate: float
    blocks_for_target: int | None
    """Extra blocks per instance that reach the target (None: not reachable by capacity)."""
    knee_blocks: int | None
    """Point of diminishing returns: beyond it, each extra block adds less than a tenth of the
    average gain per block up to there."""
    recommendation: str
    completeness: Completeness


class RoutingFigures(msgspec.Struct, frozen=True):
    """What a prefix-aware router would change."""

    duplication: float | None
    """Share of resident block hashes held by two or more instances."""
    routing_hit_rate_gain: float | None
    """Extra token-weighted hit rate if every store that was resident elsewhere had been a hit."""
    routable_stores: int
    total_stores: int
    completeness: Completeness


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
    """`[time, p50 ms, p99 ms, transfers]` of all transfers in one time bucket."""

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


class Report(msgspec.Struct, frozen=True):
    """Everything the report shows; serialized as report.json."""

    generated_at: datetime
    params: ReportParams
    fleet: FleetSummary
    instances: list[InstanceFigures]
    capacity: CapacityFigures
    routing: RoutingFigures
    transfers: TransferFigures
    findings: list[str]
    """The most important findings, most important first (plain sentences)."""

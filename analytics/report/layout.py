"""The report's document structure: sections of paragraphs, tables and images.

Both renderers (HTML and Markdown) walk the same structure, so they show the same
content; only the markup differs. Numbers are formatted here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from kvscope.analytics.report.model import Completeness, Report
from kvscope.analytics.report.plots import plot_stem
from kvscope.analytics.report.sizing import gib
from kvscope.cachemodel.access_replay import ROUTER_BALANCE


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of plain text."""

    text: str


@dataclass(frozen=True)
class Bullets:
    """A bulleted list of plain-text items."""

    items: list[str]


@dataclass(frozen=True)
class Table:
    """A table of already formatted cells."""

    headers: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    """A plot, by the stem of its PNG (see `plots.render_all`)."""

    stem: str
    alt: str


Block = Paragraph | Bullets | Table | Image


@dataclass(frozen=True)
class Section:
    """A titled section; `completeness` is shown beside the title."""

    anchor: str
    title: str
    completeness: str | None
    blocks: list[Block] = field(default_factory=list)


ROUTER = (
    "a prefix-aware router (each request to the instance holding the longest cached prefix "
    f"of its prompt, among those with at most {ROUTER_BALANCE} more requests in flight than "
    "the least loaded)"
)
"""The router every routing figure assumes, and the load balance it gives up."""


def pct(value: float | None, digits: int = 1) -> str:
    """`0.4567` → `45.7%`; None → `n/a`."""
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


def points(value: float | None) -> str:
    """A hit-rate difference `0.125` → `+12.5 points`; None → `n/a`."""
    return "n/a" if value is None else f"{value * 100:+.1f} points"


def when(value: datetime | None) -> str:
    """A timestamp as `YYYY-MM-DD HH:MM:SS UTC`; None → `n/a`."""
    return "n/a" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _label(completeness: Completeness) -> str:
    return completeness.label


def layout(report: Report, plots: set[str]) -> list[Section]:
    """The report's sections; `plots` are the stems of the PNGs that exist."""

    def image(stem: str, alt: str) -> list[Block]:
        return [Image(stem, alt)] if stem in plots else [Paragraph(f"({alt}: no data)")]

    return [
        _findings(report),
        _fleet(report),
        _capacity(report, image),
        _routing(report),
        _transfers(report, image),
        _instances(report, image),
    ]


def _findings(report: Report) -> Section:
    items = report.findings or ["Nothing notable: no data in the window."]
    return Section("findings", "Key findings", None, [Bullets(items)])


def _fleet(report: Report) -> Section:
    fleet = report.fleet
    params = report.params
    span = f"{when(fleet.start)} → {when(fleet.end)}"
    roles = ", ".join(f"{count} {role}" for role, count in sorted(fleet.roles.items()))
    blocks: list[Block] = [
        Table(
            ["", ""],
            [
                ["Time span", span],
                ["Instances", f"{len(fleet.instances)} ({roles or 'none'})"],
                ["Models", ", ".join(fleet.models) or "n/a"],
                ["Prefix-cache hit rate (token-weighted)", pct(fleet.hit_rate)],
                ["Requests (each once; P/D: prefill side)", f"{fleet.requests:,}"],
                ["Prompt tokens (each once)", f"{fleet.prompt_tokens:,}"],
                *[[f"Rows: {table}", f"{count:,}"] for table, count in fleet.records.items()],
            ],
        ),
        Table(
            ["Instance", "Role", "Model", "KV capacity (blocks)", "Block size (tokens)"],
            [
                [i.instance, i.role, i.model, f"{i.capacity_blocks:,}", str(i.block_size)]
                for i in fleet.instances
            ],
        ),
        Paragraph(
            f"Every query ran on {when(report.since)} → {when(report.until)} "
            f"({'as asked' if params.since or params.until else 'all stored data'}), "
            f"model filter: {params.model or 'all models'}; time buckets of "
            f"{report.bucket_s // 60} min (cache usage: {report.usage_bucket_s} s)."
        ),
    ]
    return Section("fleet", "Fleet summary", _label(fleet.completeness), blocks)


def _instances(report: Report, image: Callable[[str, str], list[Block]]) -> Section:
    blocks: list[Block] = [
        Table(
            [
                "Instance",
                "Role",
                "Hit rate",
                "Churn (evicted / stored)",
                "Still resident",
                "Completeness",
            ],
            [
                [
                    f.instance,
                    f.role,
                    pct(f.hit_rate),
                    pct(f.churn_ratio),
                    f"{f.still_resident:,}",
                    _label(f.completeness),
                ]
                for f in report.instances
            ],
        ),
        Paragraph(
            "Per instance: KV-cache usage from engine stats; how long blocks stayed cached "
            "before they were evicted (blocks still cached at the end are counted apart); "
            "blocks stored and evicted per time bucket."
        ),
    ]
    for figures in report.instances:
        blocks += image(f"instance-{plot_stem(figures.instance)}", f"{figures.instance} cache")
    worst = min((f.completeness.share for f in report.instances), default=1.0)
    return Section("instances", "Per instance", f"lowest {worst * 100:.1f}% complete", blocks)


def _capacity(report: Report, image: Callable[[str, str], list[Block]]) -> Section:
    capacity = report.capacity
    params = report.params
    shown = [p for p in capacity.curve if round(p.fraction * 100) % 25 == 0]
    per_token = params.kv_bytes_per_token
    headers = ["Extra capacity per instance", "Extra blocks (fleet)"]
    if per_token:
        headers.append("Extra GiB per instance")
        if params.gpu_gib:
            headers.append(f"Extra GPUs ({params.gpu_gib:g} GiB, fleet)")
    headers += ["Predicted hit rate", "Prefill tokens saved / s"]
    if params.prefill_tokens_per_gpu_s:
        headers.append("GPU-seconds saved / hour")
    rows = []
    for p in shown:
        row = [f"+{p.fraction:.0%}", f"{p.extra_blocks:+,}"]
        if per_token:
            fleet_gib = gib(p.extra_blocks, capacity.block_size, per_token)
            row.append(f"{fleet_gib / max(capacity.instances, 1):.2f}")
            if params.gpu_gib:
                row.append(f"{fleet_gib / params.gpu_gib:.1f}")
        rate = p.tokens_saved / capacity.window_s if capacity.window_s else None
        error = "" if capacity.error_pp is None else f" ± {capacity.error_pp:g} pt"
        row += [pct(p.hit_rate) + error, "n/a" if rate is None else f"{rate:,.1f}"]
        if params.prefill_tokens_per_gpu_s:
            gpu_s = None if rate is None else rate / params.prefill_tokens_per_gpu_s * 3600
            row.append("n/a" if gpu_s is None else f"{gpu_s:,.1f}")
        rows.append(row)
    sizing = (
        "KV bytes per token not given (--model-config or --kv-layers/--kv-heads/--head-dim): "
        "capacity in blocks only."
        if not per_token
        else f"{per_token:,} KV bytes per token × {capacity.block_size} tokens per block."
    )
    blocks: list[Block] = [
        Paragraph(capacity.recommendation),
        *image("capacity", "capacity what-if curve"),
        Table(headers, rows),
        Paragraph(
            f"{METHODS.get(capacity.method, capacity.method)} {sizing} "
            "Savings are rates over the window. The table shows every 25%; report.json "
            "has the whole curve."
        ),
    ]
    return Section("capacity", "Capacity what-if", _label(capacity.completeness), blocks)


METHODS = {
    "access-replay": "Method: the access stream (every request's looked-up blocks) replayed "
    "through a vLLM-like block pool of each size.",
    "access-replay-rerouted": "Method: the access stream replayed through a vLLM-like block "
    "pool of each size, routed again like the fleet's prefix-aware router.",
    "refault-corrected": "Method: refault distances from the KV events (no access stream): a "
    "cache larger by N blocks would have hit every re-stored block evicted fewer than N "
    "evictions earlier, corrected once for the evictions it avoids.",
}
"""What each `capacity_what_if` method means, in one sentence for readers."""


def _routing(report: Report) -> Section:
    routing = report.routing
    bound = (
        [["At most this much hit rate a router could add", points(routing.hit_rate_gain)]]
        if routing.levers is None
        else []
    )
    blocks: list[Block] = [
        Table(
            ["", ""],
            [
                [
                    "Block stores already resident on another instance (same model and role)",
                    f"{routing.opportunity_blocks:,} of {routing.stores:,}",
                ],
                *bound,
            ],
        ),
        *_levers(report),
        Table(
            ["Model", "Role", "Resident blocks", "Held by 2+ instances", "Duplication"],
            [
                [
                    d.model,
                    d.role,
                    f"{d.resident_hashes:,}",
                    f"{d.duplicated_hashes:,}",
                    pct(d.share),
                ]
                for d in routing.duplication
            ],
        ),
        Paragraph(
            "A store of a block that another instance of the same model and role held at that "
            "moment is a hit that routing the request there would have had. Duplication is "
            "measured at the end of the window. Decode instances are compared only with decode "
            "instances: in prefill/decode disaggregation a decode instance always holds what "
            "its prefill instance computed."
        ),
    ]
    return Section("routing", "Routing", _label(routing.completeness), blocks)


def _levers(report: Report) -> list[Block]:
    """Router alone, memory alone, both: side by side (needs the access stream)."""
    lv = report.routing.levers
    if lv is None:
        return [Paragraph("Routing vs memory: no access stream in the window to compare them.")]
    memory = f"+{lv.memory_fraction:.0%} KV memory per instance"
    per_token = report.params.kv_bytes_per_token
    capacity = report.capacity
    if per_token and capacity.curve:
        blocks = next(
            (p.extra_blocks for p in capacity.curve if p.fraction == lv.memory_fraction), 0
        )
        per_instance = gib(blocks, capacity.block_size, per_token) / max(capacity.instances, 1)
        memory += f" ({per_instance:.2f} GiB)"
    return [
        Table(
            ["Lever", "Hit-rate gain"],
            [
                ["Prefix-aware router alone", points(lv.router)],
                [f"Memory alone: {memory}", points(lv.memory)],
                ["Both", points(lv.both)],
            ],
        ),
        Paragraph(
            f"The router assumed: {ROUTER}. Hit rates of the instances that prefill, "
            "replayed from the access stream at today's capacity and at the memory on the "
            f"curve that matches the router's gain (today's routing looks {lv.routing})."
        ),
    ]


def _transfers(report: Report, image: Callable[[str, str], list[Block]]) -> Section:
    transfers = report.transfers
    slowest = transfers.pairs[:5]
    breach_share = transfers.breaches / transfers.transfers if transfers.transfers else None
    blocks: list[Block] = [
        Paragraph(
            f"{transfers.transfers:,} transfers; {transfers.breaches:,} ({pct(breach_share)}) "
            f"slower than the SLO of {transfers.slo_ms:g} ms."
        ),
        *image("transfer-heatmap", "p99 latency per pair"),
        *image("transfer-timeline", "latency over time"),
        Table(
            [
                "Prefill → decode",
                "Transfers",
                "p50 (ms)",
                "p99 (ms)",
                "max (ms)",
                "GB/s",
                "Over SLO",
            ],
            [
                [
                    f"{p.src} → {p.dst}",
                    f"{p.transfers:,}",
                    f"{p.p50_ms:.1f}",
                    f"{p.p99_ms:.1f}",
                    f"{p.max_ms:.1f}",
                    "n/a" if p.gbps is None else f"{p.gbps:.2f}",
                    f"{p.breaches:,}",
                ]
                for p in slowest
            ],
        ),
        *(
            [
                Paragraph(
                    f"Showing the {len(slowest)} slowest of {len(transfers.pairs)} pairs; "
                    "report.json has all."
                )
            ]
            if len(transfers.pairs) > len(slowest)
            else []
        ),
    ]
    return Section(
        "transfers", "KV transfers (slowest pairs)", _label(transfers.completeness), blocks
    )

"""The report's document structure: sections of paragraphs, tables and images.

Both renderers (HTML and Markdown) walk the same structure, so they show the same
content; only the markup differs. Numbers are formatted here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from kvscope.collector.analytics.report.model import Completeness, Report
from kvscope.collector.analytics.report.plots import plot_stem


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


def pct(value: float | None, digits: int = 1) -> str:
    """`0.4567` → `45.7%`; None → `n/a`."""
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


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


def _instances(report: Report, image) -> Section:  # type: ignore[no-untyped-def]
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


def _capacity(report: Report, image) -> Section:  # type: ignore[no-untyped-def]
    capacity = report.capacity
    shown = [p for p in capacity.curve if round(p.fraction * 100) % 25 == 0]
    rows = [
        [f"+{p.fraction:.0%}", f"{p.extra_blocks:+,}", pct(p.hit_rate), f"{p.tokens_saved:,}"]
        for p in shown
    ]
    blocks: list[Block] = [
        Paragraph(capacity.recommendation),
        *image("capacity", "capacity what-if curve"),
        Table(
            [
                "Extra capacity per instance",
                "Extra blocks (fleet)",
                "Predicted hit rate",
                "Prefill tokens saved",
            ],
            rows,
        ),
        Paragraph(
            "Under LRU a cache larger by N blocks would have hit every re-stored block that was "
            "evicted fewer than N evictions earlier (its refault distance). The table shows "
            "every 25%; report.json has the whole curve."
        ),
    ]
    return Section("capacity", "Capacity what-if", _label(capacity.completeness), blocks)


def _routing(report: Report) -> Section:
    routing = report.routing
    blocks: list[Block] = [
        Table(
            ["", ""],
            [
                [
                    "Block stores already resident on another instance (same model and role)",
                    f"{routing.opportunity_blocks:,} of {routing.stores:,}",
                ],
                ["Hit rate a prefix-aware router could add", pct(routing.hit_rate_gain)],
            ],
        ),
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


def _transfers(report: Report, image) -> Section:  # type: ignore[no-untyped-def]
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
    ]
    return Section(
        "transfers", "KV transfers (slowest pairs)", _label(transfers.completeness), blocks
    )

"""The report's document structure: sections of paragraphs, tables and images.

Both renderers (HTML and Markdown) walk the same structure, so they show the same
content; only the markup differs. Numbers are formatted here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kvscope.analytics.report.model import Completeness, PlannerRow, Report
from kvscope.analytics.report.plots import plot_stem
from kvscope.cachemodel.access_replay import GUESSING_REPLICAS, ROUTER_BALANCE


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


def router_text(affinity: float | None) -> str:
    """The router every routing figure assumes, and the load balance it gives up: the
    simulator's (`affinity` None) or `kvscope route`'s scorer."""
    if affinity is None:
        return (
            "a prefix-aware router (each request to the instance holding the longest cached "
            f"prefix of its prompt, among those with at most {ROUTER_BALANCE} more requests "
            "in flight than the least loaded)"
        )
    return (
        "a prefix-aware router scoring as `kvscope route` does (each request to the instance "
        f"with the best {affinity:g} x cached share of its prompt - {1 - affinity:g} x "
        "in-flight requests relative to the busiest; ties in turn)"
    )


def pct(value: float | None, digits: int = 1) -> str:
    """`0.4567` → `45.7%`; None → `n/a`."""
    return "n/a" if value is None else f"{value * 100:.{digits}f}%"


def no_gain(value: float) -> bool:
    """Whether a hit-rate gain shows as `+0.0 points` or less: nothing to act on."""
    return round(value * 100, 1) <= 0.0


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

    disaggregated = report.transfers.transfers > 0 or any(
        i.role in ("prefill", "decode") for i in report.fleet.instances
    )
    return [
        _findings(report),
        _fleet(report),
        _capacity(report, image),
        _trend(report),
        _routing(report),
        *([_transfers(report, image)] if disaggregated else []),
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
    decode = (
        [
            [
                "Decode-side hit rate (blocks not transferred; saves no prefill)",
                pct(fleet.decode_hit_rate),
            ]
        ]
        if fleet.decode_hit_rate is not None
        else []
    )
    timing = []
    if report.planner is not None and report.planner.timing.ttft_mean_ms is not None:
        t = report.planner.timing
        timing.append(
            [
                "Time to first token, mean / median (prefill side)",
                f"{t.ttft_mean_ms:,.1f} / {_number(t.ttft_p50_ms, ',.1f')} ms",
            ]
        )
    blocks: list[Block] = [
        Table(
            ["", ""],
            [
                ["Time span", span],
                ["Instances", f"{len(fleet.instances)} ({roles or 'none'})"],
                ["Models", ", ".join(fleet.models) or "n/a"],
                [
                    "Prefix-cache hit rate (token-weighted, each prompt once: instances "
                    "that prefill)",
                    pct(fleet.hit_rate),
                ],
                *decode,
                ["Requests (each once; P/D: prefill side)", f"{fleet.requests:,}"],
                ["Prompt tokens (each once)", f"{fleet.prompt_tokens:,}"],
                *timing,
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


def _trend(report: Report) -> Section:
    """The key figures per day (hour, 5 minutes): growth a planner can extrapolate."""
    trend = report.trend
    if trend is None or not trend.points:
        return Section("trend", "Trend", None, [Paragraph("No requests in the window.")])
    has_decode = any(p.decode_hit_rate is not None for p in trend.points)
    headers = [f"{trend.unit.capitalize()} starting", "Requests", "Prompt tokens", "Hit rate"]
    headers += ["Decode-side hit rate"] if has_decode else []
    rows = [
        [when(p.t), f"{p.requests:,}", f"{p.prompt_tokens:,}", pct(p.hit_rate)]
        + ([pct(p.decode_hit_rate)] if has_decode else [])
        for p in trend.points
    ]
    return Section(
        "trend",
        f"Trend (per {trend.unit})",
        None,
        [
            Table(headers, rows),
            Paragraph(
                "Requests, prompt tokens and hit rate each prompt once (instances that "
                "prefill), per "
                f"{trend.unit}; a first or last {trend.unit} cut by the window is partial."
            ),
        ],
    )


def _instances(report: Report, image: Callable[[str, str], list[Block]]) -> Section:
    capacity = {i.instance: i.capacity_blocks for i in report.fleet.instances}
    blocks: list[Block] = [
        Table(
            [
                "Instance",
                "Role",
                "Hit rate",
                "Churn (evicted / stored)",
                "Blocks cached at the end (of capacity)",
                "Completeness",
            ],
            [
                [
                    f.instance,
                    f.role,
                    pct(f.hit_rate),
                    pct(f.churn_ratio),
                    f"{f.still_resident:,} of {capacity.get(f.instance, 0):,}",
                    _label(f.completeness),
                ]
                for f in report.instances
            ],
        ),
        Paragraph(
            "Per instance: KV-cache usage from engine stats (blocks held by running "
            "requests; cached blocks that no request holds are not usage, so a full cache "
            "can show low usage); how long blocks stayed cached before they were evicted "
            "(blocks still cached at the end are counted apart); blocks stored and evicted "
            "per time bucket."
        ),
    ]
    for figures in report.instances:
        blocks += image(f"instance-{plot_stem(figures.instance)}", f"{figures.instance} cache")
    worst = min((f.completeness.share for f in report.instances), default=1.0)
    return Section("instances", "Per instance", f"lowest {worst * 100:.1f}% complete", blocks)


def _capacity(report: Report, image: Callable[[str, str], list[Block]]) -> Section:
    capacity = report.capacity
    plan = report.planner
    error = "" if capacity.error_pp is None else f" ± {capacity.error_pp:g} pt"
    rows = [r for r in (plan.rows if plan else []) if round(r.fraction * 100) % 25 == 0]
    columns: list[tuple[str, Callable[[PlannerRow], str]]] = [
        ("Extra capacity per instance", lambda r: f"+{r.fraction:.0%}"),
        ("Extra blocks (fleet)", lambda r: f"{r.extra_blocks:+,}"),
        ("Extra GiB per instance", gib_per_instance),
        ("GPUs added (whole, fleet)", lambda r: _number(r.gpus_added, ",")),
        ("Predicted hit rate", lambda r: pct(r.hit_rate) + error),
        ("Prefill tokens saved / s", lambda r: f"{r.prefill_tokens_saved_per_s:,.1f}"),
        (
            "Prefill GPU-hours saved / hour",
            lambda r: _number(r.prefill_gpu_hours_saved_per_hour, ",.2f"),
        ),
        ("Net GPUs (saved − added)", lambda r: _number(r.net_gpus, "+,.2f")),
        ("$ / hour added", lambda r: _number(r.usd_per_hour_added, ",.2f")),
        ("$ / hour saved", lambda r: _number(r.usd_per_hour_saved, ",.2f")),
        ("TTFT saved per request (ms)", lambda r: _number(r.ttft_saved_ms, ",.1f")),
    ]
    # A column whose input is missing (no --gpu-gib, no prices, ...) is left out.
    shown = [(h, f) for h, f in columns if any(f(r) != "n/a" for r in rows)]
    blocks: list[Block] = [
        Paragraph(capacity.recommendation),
        *image("capacity", "capacity what-if curve"),
        Table([h for h, _ in shown], [[f(r) for _, f in shown] for r in rows]),
        Paragraph(
            f"{METHODS.get(capacity.method, capacity.method)} {_units(report)} Savings are "
            "rates over the window, of the instances that prefill only (a decode-side hit "
            "saves no prefill). The table shows every 25%; report.json has the whole curve."
        ),
        *_uncertainty(report),
    ]
    return Section("capacity", "Capacity what-if", _label(capacity.completeness), blocks)


def gib_per_instance(row: PlannerRow) -> str:
    """A row's extra GiB per instance: one number, or the range a mixed fleet needs."""
    most, least = row.extra_gib_per_instance, row.extra_gib_per_instance_least
    if most is None:
        return "n/a"
    if least is None or f"{least:.2f}" == f"{most:.2f}":
        return f"{most:.2f}"
    return f"{least:.2f}–{most:.2f}"


def _number(value: float | None, spec: str) -> str:
    """`value` formatted with `spec`; None → `n/a`."""
    return "n/a" if value is None else format(value, spec)


def _units(report: Report) -> str:
    """Where the table's GiB, GPUs, GPU time and TTFT come from, in one or two sentences."""
    plan = report.planner
    if plan is None or plan.bytes_per_block is None:
        text = (
            "KV bytes per block unknown (no --model-config or --kv-layers/--kv-heads/"
            "--head-dim, and no KV transfers with bytes): capacity in blocks only"
        )
        if report.params.gpu_gib:
            text += f", so --gpu-gib {report.params.gpu_gib:g} cannot count GPUs"
        text += "."
    else:
        where = {
            "model-config": "the model's shape given",
            "kv-transfers": "the bytes per block the engines' KV transfers carried",
        }[plan.bytes_source]
        text = f"{plan.bytes_per_block:,} KV bytes per block, from {where}."
        if plan.gpu_gib:
            text += (
                f" GPUs are whole GPUs of {plan.gpu_gib:g} GiB of KV memory added to each "
                "instance that prefills."
            )
    if plan is not None and plan.prefill_tokens_per_gpu_s:
        source = (
            "given (--prefill-tokens-per-gpu-s)"
            if plan.prefill_rate_source == "flag"
            else "measured from the stored request timings, one GPU per instance"
        )
        text += (
            f" Prefill throughput {plan.prefill_tokens_per_gpu_s:,.0f} tokens/s per GPU, {source}."
        )
    if plan is not None and plan.timing.prefill_s_per_token is not None:
        text += (
            " TTFT saved = tokens saved per request × the measured prefill time per token "
            f"({plan.timing.prefill_s_per_token * 1e6:,.1f} µs)."
        )
    return text


def _uncertainty(report: Report) -> list[Block]:
    """How far to trust the curve: method, error, where measured, window warnings."""
    doubt = report.uncertainty
    if doubt is None:
        return []
    items = [
        f"Method: {doubt.method}; error range ±{_number(doubt.error_pp, 'g')} points of hit "
        f"rate, measured against {doubt.measured_against}.",
        f"Window: {timedelta(seconds=round(doubt.window_s))}; "
        + (
            "some cache never filled (no eviction)."
            if doubt.warm_up_s is None
            else f"caches full (first eviction) by {timedelta(seconds=round(doubt.warm_up_s))} "
            f"into it (to {report.bucket_s // 60} min)."
        ),
    ]
    for half, name in zip(doubt.halves, ("First half", "Second half"), strict=False):
        needed = "n/a" if half.fraction_for_target is None else f"+{half.fraction_for_target:.0%}"
        items.append(
            f"{name} ({when(half.since)} → {when(half.until)}): "
            + (
                "no data."
                if half.hit_rate is None
                else f"hit rate {pct(half.hit_rate)}, target needs {needed}."
            )
        )
    if doubt.stable is not None:
        items.append(
            "The two halves agree." if doubt.stable else "The two halves disagree: see below."
        )
    items += doubt.warnings
    return [Paragraph("How far to trust it:"), Bullets(items)]


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
    rows = report.planner.rows if report.planner else []
    row = next((r for r in rows if r.fraction == lv.memory_fraction), None)
    if row is not None and row.extra_gib_per_instance is not None:
        memory += f" ({gib_per_instance(row)} GiB)"
    side_by_side: list[Block] = (
        [
            Paragraph(
                f"Routing vs memory: a prefix-aware router gains {points(lv.router)} on this "
                "traffic at today's capacity, so there is no router gain for memory to match; "
                "the capacity what-if above shows what memory alone buys."
            )
        ]
        if no_gain(lv.router)
        else [
            Table(
                ["Lever", "Hit-rate gain"],
                [
                    ["Prefix-aware router alone", points(lv.router)],
                    [f"Memory alone: {memory}", points(lv.memory)],
                    ["Both", points(lv.both)],
                ],
            )
        ]
    )
    return [
        *side_by_side,
        Table(
            ["Router on this traffic, today's memory", "Hit-rate change vs today"],
            [
                ["Round-robin", points(lv.round_robin)],
                [
                    f"Guessing prefix routers ({GUESSING_REPLICAS} replicas, each by its own "
                    "decisions, no evictions seen)",
                    points(lv.guesser),
                ],
                ["Exact prefix router (kvscope index: the engines' own events)", points(lv.router)],
            ],
        ),
        Paragraph(
            "What exact routing would have saved you: "
            f"{points(lv.router - lv.guesser)} of prompt tokens over a router that guesses "
            "each instance's cache from its own decisions (the Gateway API inference "
            "extension's prefix scorer, Dynamo's approximate mode), "
            f"{points(lv.router - lv.round_robin)} over round-robin (docs/routing.md)."
        ),
        Paragraph(
            f"The router assumed: {router_text(lv.router_affinity)}. Hit rates of the "
            "instances that prefill, replayed from the access stream at today's capacity and "
            "at the memory on the curve that matches the router's gain (today's routing "
            f"looks {lv.routing})."
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

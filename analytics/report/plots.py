"""Plots of the report's figures, rendered with matplotlib (Agg) to PNG bytes.

Each function takes part of the `Report` and returns one PNG, or None when there is
nothing to draw. Every plot has a title, labelled axes and units.
"""

from __future__ import annotations

import io
import warnings
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from kvscope.analytics.queries import terminal_safe
from kvscope.analytics.report.model import (
    CapacityFigures,
    InstanceFigures,
    Report,
    TransferFigures,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
_BLUE, _ORANGE, _GREEN, _RED, _GREY = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#7f7f7f"


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _png(fig: Figure) -> bytes:
    """The figure as PNG bytes. A character of a name that the font lacks is drawn as a
    box; matplotlib's warning about it would reach the terminal of `kvscope serve` on
    every `/report`, so it is dropped here."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from font", UserWarning)
        fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _time_axis(ax: object, window: tuple[datetime, datetime]) -> None:
    import matplotlib.dates as mdates

    ax.set_xlim(*window)  # type: ignore[attr-defined]
    locator = mdates.AutoDateLocator(maxticks=6)
    ax.xaxis.set_major_locator(locator)  # type: ignore[attr-defined]
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[attr-defined]
    ax.set_xlabel("time (UTC)")  # type: ignore[attr-defined]


def _marker(points: list) -> str | None:
    """Dots when a series is too short to show as a line."""
    return "o" if len(points) < 3 else None


def _empty(ax: object, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", color=_GREY, transform=ax.transAxes)  # type: ignore[attr-defined]
    ax.set_xticks([])  # type: ignore[attr-defined]
    ax.set_yticks([])  # type: ignore[attr-defined]


def instance_plot(
    figures: InstanceFigures, bucket_s: int, window: tuple[datetime, datetime]
) -> bytes:
    """Three panels for one instance: cache usage, residency distribution, eviction churn."""
    fig, (usage_ax, residency_ax, churn_ax) = _figure(13, 3.4, ncols=3)
    fig.suptitle(terminal_safe(f"{figures.instance} ({figures.role})"), fontweight="bold")

    usage_ax.set_title("KV-cache usage (blocks held by running requests)")
    if figures.usage:
        usage_ax.plot(
            [p.t for p in figures.usage],
            [p.value * 100 for p in figures.usage],
            _BLUE,
            marker=_marker(figures.usage),
        )
        usage_ax.set_ylim(0, 105)
        usage_ax.set_ylabel("blocks held by requests (%)")
        _time_axis(usage_ax, window)
    else:
        _empty(usage_ax, "no engine stats")

    residency_ax.set_title(f"How long blocks stayed cached ({figures.still_resident:,} still are)")
    if figures.residency_s:
        labels = [_duration_label(b.lo, b.hi) for b in figures.residency_s]
        residency_ax.bar(range(len(labels)), [b.count for b in figures.residency_s], color=_GREEN)
        residency_ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        residency_ax.set_xlabel("residency time")
        residency_ax.set_ylabel("blocks")
    else:
        _empty(residency_ax, "no evicted blocks")

    churn_ax.set_title("Eviction churn")
    if figures.churn:
        half = timedelta(seconds=bucket_s / 2)
        centers = [p.t + half for p in figures.churn]
        churn_ax.bar(
            centers,
            [p.stores for p in figures.churn],
            width=timedelta(seconds=bucket_s * 0.9),
            color=_BLUE,
            alpha=0.3,
            label="stored",
        )
        churn_ax.plot(
            centers, [p.removals for p in figures.churn], _RED, marker=".", label="evicted"
        )
        churn_ax.set_ylabel(f"blocks per {_duration(bucket_s)}")
        churn_ax.set_ylim(bottom=0)
        churn_ax.legend(loc="best", fontsize=8)
        _time_axis(churn_ax, window)
    else:
        _empty(churn_ax, "no block events")
    return _png(fig)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 120:
        return f"{seconds:.3g}s"
    if seconds < 7200:
        return f"{seconds / 60:.3g}m"
    return f"{seconds / 3600:.3g}h"


def _duration_label(lo: float, hi: float) -> str:
    return f"{_duration(lo)}–{_duration(hi)}"


def capacity_plot(capacity: CapacityFigures) -> bytes | None:
    """The what-if curve: extra KV capacity → predicted hit rate and prefill tokens saved."""
    if not capacity.curve:
        return None
    fig, (ax,) = _figure(8, 4)
    extra = [p.fraction * 100 for p in capacity.curve]
    ax.plot(
        extra,
        [p.hit_rate * 100 for p in capacity.curve],
        _BLUE,
        marker="o",
        markersize=3,
        label="predicted hit rate",
    )
    ax.set_title("Capacity what-if: more KV blocks → higher prefix-cache hit rate")
    ax.set_xlabel("extra KV capacity per instance (% of current blocks)")
    ax.set_ylabel("predicted hit rate (%)", color=_BLUE)
    ax.axhline(
        capacity.target_hit_rate * 100,
        color=_GREY,
        linestyle="--",
        linewidth=1,
        label=f"target {capacity.target_hit_rate:.0%}",
    )
    if capacity.knee_fraction is not None:
        ax.axvline(
            capacity.knee_fraction * 100,
            color=_ORANGE,
            linestyle=":",
            linewidth=1.5,
            label=f"diminishing returns after +{capacity.knee_fraction:.0%}",
        )
    for point in capacity.curve:
        if point.fraction == capacity.fraction_for_target:
            ax.plot(
                [point.fraction * 100],
                [point.hit_rate * 100],
                "*",
                color=_RED,
                markersize=12,
                label=f"target reached at +{point.fraction:.0%}",
            )
    ax.legend(loc="lower right", fontsize=8)
    saved = ax.twinx()
    saved.plot(extra, [p.tokens_saved for p in capacity.curve], _GREEN, linewidth=1, alpha=0.7)
    saved.set_ylabel("prefill tokens saved in the window (green)", color=_GREEN)
    saved.set_ylim(bottom=0)
    saved.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")
    return _png(fig)


def transfer_heatmap(transfers: TransferFigures) -> bytes | None:
    """p99 KV-transfer latency per prefill (row) → decode (column) pair."""
    if not transfers.pairs:
        return None
    sources = sorted({p.src for p in transfers.pairs})
    targets = sorted({p.dst for p in transfers.pairs})
    grid = [[float("nan")] * len(targets) for _ in sources]
    for pair in transfers.pairs:
        grid[sources.index(pair.src)][targets.index(pair.dst)] = pair.p99_ms
    fig, (ax,) = _figure(1.6 + 1.3 * len(targets), 1.4 + 0.55 * len(sources))
    image = ax.imshow(grid, cmap="YlOrRd", aspect="auto")
    ax.set_title("p99 KV-transfer latency per pair (ms)")
    ax.set_xticks(range(len(targets)), map(terminal_safe, targets), rotation=30, ha="right")
    ax.set_yticks(range(len(sources)), map(terminal_safe, sources))
    ax.set_xlabel("decode instance (receiver)")
    ax.set_ylabel("prefill instance (sender)")
    finite = [v for row in grid for v in row if v == v]
    middle = (max(finite) + min(finite)) / 2 if finite else 0
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value == value:
                colour = "white" if value > middle else "black"
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", color=colour, fontsize=9)
    fig.colorbar(image, ax=ax, label="p99 latency (ms)")
    return _png(fig)


def transfer_timeline(
    transfers: TransferFigures, window: tuple[datetime, datetime]
) -> bytes | None:
    """p50 and p99 per prefill→decode pair over time, with the SLO line."""
    if not transfers.timeline:
        return None
    fig, (p50_ax, p99_ax) = _figure(13, 3.8, ncols=2)
    fig.suptitle("KV-transfer latency over time per prefill → decode pair", fontweight="bold")
    series: dict[tuple[str, str], list] = {}
    for point in transfers.timeline:
        series.setdefault((point.src, point.dst), []).append(point)
    slowest = {(p.src, p.dst) for p in transfers.pairs[:1]}
    for ax, title, value in (
        (p50_ax, "p50 (median)", lambda p: p.p50_ms),
        (p99_ax, "p99", lambda p: p.p99_ms),
    ):
        for pair, points in sorted(series.items()):
            emphasis = {"linewidth": 2.2} if pair in slowest else {"linewidth": 1, "alpha": 0.8}
            ax.plot(
                [p.t for p in points],
                [value(p) for p in points],
                marker=_marker(points),
                label=terminal_safe(f"{pair[0]} → {pair[1]}"),
                **emphasis,
            )
        ax.axhline(
            transfers.slo_ms,
            color=_GREY,
            linestyle="--",
            linewidth=1,
            label=f"SLO {transfers.slo_ms:g} ms",
        )
        ax.set_title(title)
        ax.set_ylabel("latency (ms)")
        ax.set_ylim(bottom=0)
        _time_axis(ax, window)
    p99_ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    return _png(fig)


def render_all(report: Report) -> dict[str, bytes]:
    """Every plot of the report by file stem (`capacity`, `instance-<name>`, ...)."""
    # Series points sit at bucket starts: begin the time axis at the first bucket.
    first_bucket = report.since.timestamp() // report.bucket_s * report.bucket_s
    window = (datetime.fromtimestamp(first_bucket, report.since.tzinfo), report.until)
    plots: dict[str, bytes | None] = {
        "capacity": capacity_plot(report.capacity),
        "transfer-heatmap": transfer_heatmap(report.transfers),
        "transfer-timeline": transfer_timeline(report.transfers, window),
    }
    for figures in report.instances:
        plots[f"instance-{plot_stem(figures.instance)}"] = instance_plot(
            figures, report.bucket_s, window
        )
    return {name: png for name, png in plots.items() if png is not None}


def plot_stem(name: str) -> str:
    """A file-name-safe form of an instance name."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)

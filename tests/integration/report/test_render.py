"""Rendering a hand-made report: the three formats agree and the HTML is self-contained."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import msgspec
import pytest
from kvscope.analytics.report import advice
from kvscope.analytics.report.model import Report, WhatIfPoint
from kvscope.analytics.report.write import write_report
from kvscope.collector.errors import OutputError


def test_three_formats_show_the_same_figures(sample_report: Report, tmp_path: Path) -> None:
    files = write_report(sample_report, tmp_path)
    html = files.html.read_text()
    markdown = files.markdown.read_text()

    assert msgspec.json.decode(files.json.read_bytes(), type=Report) == sample_report
    # One plot per instance plus capacity, heatmap, timeline; all embedded, all written.
    assert len(files.images) == len(sample_report.instances) + 3
    assert html.count('<img src="data:image/png;base64,') == len(files.images)
    for image in files.images:
        assert image.read_bytes().startswith(b"\x89PNG")
        assert f"](images/{image.name})" in markdown
    for text in [*sample_report.findings, sample_report.capacity.recommendation]:
        assert text in markdown
        assert text.replace("→", "&rarr;") in html or text in html
    slowest = sample_report.transfers.pairs[0]
    for document in (html, markdown):
        assert f"{slowest.p99_ms:.1f}" in document
        assert sample_report.fleet.completeness.label in document


def test_html_needs_no_network(sample_report: Report, tmp_path: Path) -> None:
    html = write_report(sample_report, tmp_path).html.read_text()
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html)
    assert "<script" not in html
    assert "@import" not in html


def test_a_directory_that_cannot_be_written_is_one_error(
    sample_report: Report, tmp_path: Path
) -> None:
    """`--out` under a file: the report's own error naming the path, not an OSError."""
    (tmp_path / "a-file").write_text("not a directory\n")
    with pytest.raises(OutputError, match=r"cannot write the report to .*a-file.*: Not a direc"):
        write_report(sample_report, tmp_path / "a-file" / "report")


def test_empty_window_still_renders(sample_report: Report, tmp_path: Path) -> None:
    empty = msgspec.structs.replace(
        sample_report,
        instances=[],
        capacity=msgspec.structs.replace(sample_report.capacity, curve=[]),
        transfers=msgspec.structs.replace(sample_report.transfers, pairs=[], timeline=[]),
        findings=[],
    )
    files = write_report(empty, tmp_path)
    assert files.images == []
    assert "no data" in files.html.read_text()


def _curve(rates: list[float]) -> list[WhatIfPoint]:
    return [WhatIfPoint(i / 10, i * 100, rate, int(rate * 1000)) for i, rate in enumerate(rates)]


def test_capacity_advice_on_known_curves() -> None:
    curve = _curve([0.40, 0.50, 0.58, 0.62, 0.623, 0.624])
    assert advice.fraction_for_target(curve, 0.6) == 0.3
    assert advice.fraction_for_target(curve, 0.9) is None
    assert advice.knee(curve) == 0.3
    assert advice.knee(_curve([0.4, 0.5, 0.6, 0.7])) is None
    text = advice.recommendation(0.40, curve, 0.6, 0.3)
    assert text.startswith("Add 30% more KV capacity per instance (+300 blocks fleet-wide)")
    assert "Beyond +30% capacity" in text
    assert "No capacity on the curve reaches the 90.0% target" in advice.recommendation(
        0.4, curve, 0.9, None
    )
    assert "already reaches" in advice.recommendation(0.7, curve, 0.6, None)


def test_capacity_in_gib_gpus_rates_and_levers(sample_report: Report, tmp_path: Path) -> None:
    """GiB per instance, whole GPUs, tokens/s, GPU-hours/hour, dollars, TTFT, ± error and
    both levers, from the figures."""
    files = write_report(sample_report, tmp_path)
    cap, params = sample_report.capacity, sample_report.params
    assert params.kv_bytes_per_token and params.gpu_gib and params.prefill_tokens_per_gpu_s
    assert params.usd_per_gpu_hour
    point = next(p for p in cap.curve if p.fraction == 0.5)
    per_instance = point.extra_blocks * cap.block_size * params.kv_bytes_per_token / 2**30
    per_instance /= cap.instances
    gpus = cap.instances * math.ceil(per_instance / params.gpu_gib)
    rate = point.tokens_saved / cap.window_s
    gpu_hours = rate / params.prefill_tokens_per_gpu_s
    ttft_ms = 1000 * point.tokens_saved / sample_report.fleet.requests * 12.0 / 96000
    expected = [
        f"{per_instance:.2f}",
        f"{gpus:,}",
        f"{rate:,.1f}",
        f"{gpu_hours:,.2f}",
        f"{gpu_hours - gpus:+,.2f}",
        f"{gpus * params.usd_per_gpu_hour:,.2f}",
        f"{gpu_hours * params.usd_per_gpu_hour:,.2f}",
        f"{ttft_ms:,.1f}",
        f"± {cap.error_pp:g} pt",
        "Prefix-aware router alone",
        "+24.9 points",
        "Requests (each once; P/D: prefill side)",
        "measured against simulator re-runs",
        "First half",
        "Trend (per 5 minutes)",
    ]
    for document in (files.html.read_text(), files.markdown.read_text()):
        for text in expected:
            assert text in document, text
    figures = json.loads(files.json.read_text())
    row = next(r for r in figures["planner"]["rows"] if r["fraction"] == 0.5)
    assert row["gpus_added"] == gpus and row["extra_gib_per_instance"] == per_instance
    assert row["usd_per_hour_added"] == gpus * params.usd_per_gpu_hour
    assert abs(row["ttft_saved_ms"] - ttft_ms) < 1e-9


def test_findings_need_a_minimum_sample(sample_report: Report) -> None:
    """A slow pair with fewer transfers than the minimum is not a finding of its own."""
    report = sample_report
    args = (report.fleet, report.instances, "capacity", report.routing, report.transfers)
    judged = advice.findings(*args, min_transfers=100)
    assert any("slowest pair" in f for f in judged)
    too_few = advice.findings(*args, min_transfers=101)
    assert not any("slowest pair" in f for f in too_few)
    assert any("too few to judge" in f for f in too_few)


def test_no_churn_finding_when_nothing_was_evicted(sample_report: Report) -> None:
    """A cache that evicted nothing: no instance "churns most" (it said '0.0% of stored
    blocks were evicted'). Nothing else to say about transfers and routing here."""
    report = sample_report
    quiet = (
        msgspec.structs.replace(report.routing, hit_rate_gain=None, levers=None),
        msgspec.structs.replace(report.transfers, pairs=[]),
    )
    churning = advice.findings(report.fleet, report.instances, "capacity", *quiet)
    assert any("churns most" in f for f in churning)
    calm = [msgspec.structs.replace(f, churn_ratio=0.0) for f in report.instances]
    assert not any(
        "churns most" in f for f in advice.findings(report.fleet, calm, "capacity", *quiet)
    )


def test_truncated_table_says_so(sample_report: Report, tmp_path: Path) -> None:
    pairs = sample_report.transfers.pairs * 2
    bigger = msgspec.structs.replace(
        sample_report, transfers=msgspec.structs.replace(sample_report.transfers, pairs=pairs)
    )
    markdown = write_report(bigger, tmp_path).markdown.read_text()
    assert f"Showing the 5 slowest of {len(pairs)} pairs" in markdown
    assert "Showing the" not in write_report(sample_report, tmp_path / "b").markdown.read_text()


@pytest.mark.parametrize("name", ["pod\x1b[31m-red\x07\r", "推理-0", "pod-\U0001f680"])
def test_plots_of_odd_names_warn_nothing(sample_report: Report, tmp_path: Path, name: str) -> None:
    """Each `/report` of a running serve printed matplotlib's missing-glyph UserWarnings."""
    renamed = [
        msgspec.structs.replace(f, instance=name) if k == 0 else f
        for k, f in enumerate(sample_report.instances)
    ]
    pairs = [msgspec.structs.replace(p, src=name) for p in sample_report.transfers.pairs]
    report = msgspec.structs.replace(
        sample_report,
        instances=renamed,
        transfers=msgspec.structs.replace(sample_report.transfers, pairs=pairs),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report(report, tmp_path)
    assert [str(w.message) for w in caught] == []


def test_names_with_control_characters_are_shown_escaped(
    sample_report: Report, tmp_path: Path
) -> None:
    """An engine's name with ESC, BEL or CR: written visibly escaped, never raw (a report
    shown with `cat` would otherwise run them on the terminal)."""
    hostile = "pod\x1b[31m-red\x07\r"
    instances = [
        msgspec.structs.replace(sample_report.instances[0], instance=hostile),
        *sample_report.instances[1:],
    ]
    files = write_report(msgspec.structs.replace(sample_report, instances=instances), tmp_path)
    for document in (files.markdown.read_text(), files.html.read_text()):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", document)
        assert "pod\\x1b[31m-red\\x07\\x0d" in document

"""`kvscope demo --scale small` end to end: broker, collector, simulated fleet, report.

The demo runs as a subprocess (as a user runs it): it opens its own chDB directory, and
chDB allows one per process. The checks then read the demo's report files, run
`kvscope query` against the demo's database, and open report.html in headless Chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.chromium_cdp import CHROMIUM, Chromium

REPO = Path(__file__).resolve().parents[3]
SCREENSHOT = REPO / "docs" / "images" / "report-screenshot.png"


def kvscope(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the `kvscope` CLI in a fresh interpreter; fail with its output when it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"kvscope {args[0]} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One small demo run shared by the checks below: (output dir, its stdout)."""
    out = tmp_path_factory.mktemp("demo")
    prices = ["--gpu-gib", "80", "--usd-per-gpu-hour", "2.5"]
    result = kvscope("demo", "--scale", "small", "--out", str(out), *prices)
    return out, result.stdout


def query(out: Path, name: str, **params: object) -> list[dict]:
    """`kvscope query NAME --format json` against the demo's database."""
    args = ["query", name, "--clickhouse", f"chdb://{out / 'chdb'}", "--format", "json"]
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    return json.loads(kvscope(*args).stdout)


def test_demo_leaves_three_formats_and_prints_findings(demo: tuple[Path, str]) -> None:
    out, stdout = demo
    for name in ("report.html", "report.md", "report.json"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert len(report["findings"]) == 3
    for finding in report["findings"]:
        assert finding in stdout
    assert str(out / "report.html") in stdout
    html = (out / "report.html").read_text()
    markdown = (out / "report.md").read_text()
    # The JSON holds the figures the HTML (and the Markdown) show.
    for pair in report["transfers"]["pairs"][:5]:
        for document in (html, markdown):
            assert f"{pair['p99_ms']:.1f}" in document
            assert f"{pair['src']} → {pair['dst']}" in document
    for figures in report["instances"]:
        assert figures["instance"] in html
    assert report["capacity"]["recommendation"] in markdown
    # The simulated fleet has several prefill and decode instances, a slow pair, evictions.
    assert report["fleet"]["roles"].get("prefill", 0) >= 2
    assert report["fleet"]["roles"].get("decode", 0) >= 2
    assert report["transfers"]["breaches"] > 0
    assert any(f["churn_ratio"] for f in report["instances"])


def test_report_html_in_headless_chromium(demo: tuple[Path, str], tmp_path: Path) -> None:
    """Set KVSCOPE_UPDATE_SCREENSHOT=1 to also refresh docs/images/report-screenshot.png
    and report-capacity.png (the capacity section in a planner's units)."""
    assert CHROMIUM, "needs Chromium: apt-get install -y chromium (as .ci/run does)"
    out, _ = demo
    report = json.loads((out / "report.json").read_text())
    with Chromium() as browser:
        page = browser.open(out / "report.html")
        shot = browser.screenshot(tmp_path / "report-screenshot.png")
        browser.evaluate("document.getElementById('capacity').scrollIntoView()")
        planner = browser.screenshot(tmp_path / "report-capacity.png")
    assert page.console_errors == []
    assert page.title == "kvscope capacity-planning report"
    # Every plot decoded: one per instance plus capacity, pair heatmap and latency timeline.
    assert len(page.images) == len(report["instances"]) + 3
    assert all(image["complete"] and image["naturalWidth"] > 0 for image in page.images)
    assert shot.read_bytes().startswith(b"\x89PNG")
    # The planner's units: whole GPUs and dollars from the flags, GiB from the transfers.
    html = (out / "report.html").read_text()
    for column in ("Extra GiB per instance", "GPUs added (whole, fleet)", "$ / hour added"):
        assert column in html, column
    assert planner.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("KVSCOPE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
        shutil.copyfile(planner, SCREENSHOT.with_name("report-capacity.png"))


def test_report_numbers_equal_kvscope_query(demo: tuple[Path, str]) -> None:
    out, _ = demo
    report = json.loads((out / "report.json").read_text())
    window = {"since": report["since"], "until": report["until"]}

    rows = query(out, "hit_rate", **window)
    hit = {r["instance"]: r for r in rows}
    # Each prompt once: the fleet figure sums the instances that prefill (P/D).
    served = [r for r in rows if r["instance"] != "*" and r["role"] != "decode"]
    assert {r["role"] for r in rows} >= {"prefill", "decode"}
    hits, queried = (sum(r[c] for r in served) for c in ("prefix_hits", "prefix_queries"))
    assert report["fleet"]["hit_rate"] == hits / queried
    churn = {r["instance"]: r for r in query(out, "eviction_churn", **window)}
    for figures in report["instances"]:
        assert figures["hit_rate"] == hit[figures["instance"]]["hit_rate"]
        assert figures["churn_ratio"] == churn[figures["instance"]]["churn_ratio"]

    usage = query(out, "report_usage", bucket_s=report["usage_bucket_s"], **window)
    for figures in report["instances"]:
        assert [point[1] for point in figures["usage"]] == [
            r["usage"] for r in usage if r["instance"] == figures["instance"]
        ]

    fractions = [point[0] for point in report["capacity"]["curve"]]
    what_if = query(out, "capacity_what_if", fractions=",".join(map(str, fractions)), **window)
    # The curve sums the instances that prefill: a decode-side hit saves no prefill.
    prefill = {r["instance"] for r in served}
    curve = []
    for fraction in fractions:
        points = [r for r in what_if if r["instance"] in prefill and r["fraction"] == fraction]
        extra, saved = (
            sum(r[c] for r in points) for c in ("extra_blocks", "predicted_saved_tokens")
        )
        curve.append([fraction, extra, (hits + saved) / queried, saved])
    assert report["capacity"]["curve"] == curve

    opportunity = query(out, "routing_opportunity", **window)
    assert report["routing"]["opportunity_blocks"] == sum(
        r["opportunity_blocks"] for r in opportunity if r["instance"] in prefill
    )
    assert report["routing"]["duplication"] == [
        {
            "model": r["model"],
            "role": r["role"],
            "resident_hashes": r["resident_hashes"],
            "duplicated_hashes": r["duplicated_hashes"],
            "share": r["duplication_share"],
        }
        for r in query(out, "duplication", until=window["until"])
    ]

    latency = {
        (r["src_instance"], r["dst_instance"]): r
        for r in query(out, "transfer_latency", bucket_s=4_000_000_000, **window)
    }
    breaches = {
        (r["src_instance"], r["dst_instance"]): r["breaches"]
        for r in query(
            out, "report_transfer_breaches", slo_ms=report["params"]["transfer_slo_ms"], **window
        )
    }
    assert len(report["transfers"]["pairs"]) == len(latency) >= 4
    for pair in report["transfers"]["pairs"]:
        row = latency[(pair["src"], pair["dst"])]
        assert (pair["transfers"], pair["p50_ms"], pair["p99_ms"], pair["max_ms"]) == (
            row["transfers"],
            row["p50_ms"],
            row["p99_ms"],
            row["max_ms"],
        )
        assert pair["breaches"] == breaches[(pair["src"], pair["dst"])]
    timeline = query(out, "transfer_latency", bucket_s=report["bucket_s"], **window)
    assert [point[3:] for point in report["transfers"]["timeline"]] == [
        [r["p50_ms"], r["p99_ms"], r["transfers"]] for r in timeline
    ]

"""The report in a planner's units on simulated fleets, derived from the simulator's truth.

GiB from the bytes per block the engines' KV transfers carried (the simulator's
`bytes_per_block`), whole GPUs, GPU-hours of prefill from the measured prefill time per
token (the simulator reports `prefill_tokens_per_s`), dollars, the TTFT effect, the trend
and the window's warnings; and `--gpu-gib` without a model shape is said, not ignored.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kvscope.analytics.report import planner
from kvscope.analytics.report.build import build_report
from kvscope.cli.main import main
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import simulate_direct


@pytest.mark.parametrize(
    ("prefill_rate", "bytes_per_block", "gpu_gib"),
    [(8000.0, 2 * 1024 * 1024, 0.25), (3000.0, 192 * 1024, 0.01), (20000.0, 4096, 1.0)],
)
def test_planner_units_from_the_simulators_truth(
    clickhouse: Any,
    clickhouse_url: str,
    tmp_path: Path,
    prefill_rate: float,
    bytes_per_block: int,
    gpu_gib: float,
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(
        instances=parse_instances("2p,2d"),
        workload="generated-shared-prefix",
        capacity_blocks=160,
        requests=300,
        rate=0.5,
        seed=5,
        prefill_tokens_per_s=prefill_rate,
        bytes_per_block=bytes_per_block,
    )
    simulate_direct(clickhouse, config)
    usd = 2.5
    sizing = {"gpu_gib": gpu_gib, "usd_per_gpu_hour": usd}
    report, files = build_report(target, tmp_path, sizing=sizing, client=clickhouse)
    plan, fleet, capacity = report.planner, report.fleet, report.capacity
    assert plan is not None
    assert (plan.bytes_per_block, plan.bytes_source) == (bytes_per_block, "kv-transfers")
    assert plan.timing.prefill_s_per_token == pytest.approx(1 / prefill_rate)
    assert plan.prefill_rate_source == "measured"
    assert plan.prefill_tokens_per_gpu_s == pytest.approx(prefill_rate)
    for row, point in zip(plan.rows, capacity.curve, strict=True):
        per_instance = point.extra_blocks * bytes_per_block / 2**30 / capacity.instances
        assert row.extra_gib_per_instance == pytest.approx(per_instance)
        gpus = capacity.instances * math.ceil(per_instance / gpu_gib - 1e-9)
        assert row.gpus_added == gpus
        saved_per_s = point.tokens_saved / capacity.window_s
        assert row.prefill_gpu_hours_saved_per_hour == pytest.approx(saved_per_s / prefill_rate)
        assert row.net_gpus == pytest.approx(saved_per_s / prefill_rate - gpus)
        assert row.usd_per_hour_added == pytest.approx(gpus * usd)
        ttft_ms = 1000 * point.tokens_saved / fleet.requests / prefill_rate
        assert row.ttft_saved_ms == pytest.approx(ttft_ms)
    # The trend counts each prompt once and adds up to the fleet's figures.
    trend = report.trend
    assert trend is not None and (trend.unit, trend.bucket_s) == ("5 minutes", 300)
    assert sum(p.requests for p in trend.points) == fleet.requests == config.requests
    assert sum(p.prompt_tokens for p in trend.points) == fleet.prompt_tokens
    # 600 simulated seconds: short; the halves are computed and compared.
    doubt = report.uncertainty
    assert doubt is not None and doubt.short_window and len(doubt.halves) == 2
    assert doubt.measured_against.startswith("simulator re-runs")
    assert capacity.error_basis == "simulator", "the simulator's data"
    on_real = msgspec.structs.replace(capacity, error_basis="real-engines")
    real_doubt = planner.uncertainty(on_real, datetime.now(UTC), 30.0, list(doubt.halves))
    assert real_doubt.measured_against.startswith("real vLLM engines")
    assert any("window is short" in w for w in doubt.warnings)
    assert "window is short" in capacity.recommendation
    figures = json.loads(files.json.read_text())
    assert {"gpus_added", "extra_gib", "usd_per_hour_added", "ttft_saved_ms"} <= set(
        figures["planner"]["rows"][0]
    )
    html = files.html.read_text()
    assert "GPUs added (whole, fleet)" in html and "TTFT saved per request (ms)" in html


def test_gpu_gib_without_a_model_shape_is_said(
    clickhouse: Any, clickhouse_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No P/D transfers and no model shape: it was silently ignored."""
    migrate(clickhouse, parse_target(clickhouse_url))
    config = SimConfig(instances=parse_instances("2"), capacity_blocks=120, requests=200)
    simulate_direct(clickhouse, config)
    command = ["report", "--clickhouse", clickhouse_url, "--gpu-gib", "40", "--out"]
    assert main([*command, str(tmp_path / "bare")]) == 0
    assert "--gpu-gib 40 cannot count GPUs" in caplog.text
    assert "so --gpu-gib 40 cannot count GPUs" in (tmp_path / "bare" / "report.md").read_text()
    shape = ["--kv-layers", "32", "--kv-heads", "8", "--head-dim", "128"]
    assert main([*command, str(tmp_path / "shaped"), *shape]) == 0
    report = json.loads((tmp_path / "shaped" / "report.json").read_text())
    assert report["planner"]["bytes_source"] == "model-config"
    assert report["planner"]["bytes_per_block"] == 32 * 8 * 128 * 2 * 2 * 16
    finding = report["capacity"]["recommendation"]
    assert "GiB per instance" in finding and "GPUs of 40 GiB" in finding


@pytest.mark.parametrize("capacity", [4000, 60])
def test_a_cache_that_never_filled_is_a_warning(
    clickhouse: Any, clickhouse_url: str, tmp_path: Path, capacity: int
) -> None:
    """The window is all warm-up when a cache never evicted: more memory cannot be judged."""
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(instances=parse_instances("2"), capacity_blocks=capacity, requests=150)
    truth, _ = simulate_direct(clickhouse, config)
    report, _ = build_report(target, tmp_path, client=clickhouse)
    doubt = report.uncertainty
    assert doubt is not None
    never = any(s["removed_blocks"] == 0 for s in truth["sources"].values())
    assert (doubt.warm_up_s is None) == never
    assert any("never filled" in w for w in doubt.warnings) == never
    if not never:
        assert doubt.warm_up_s is not None and 0 < doubt.warm_up_s <= doubt.window_s + 60

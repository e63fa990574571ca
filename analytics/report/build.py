"""`build_report`: connect, gather the figures, render and write the report files."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvscope.analytics.report.gather import gather_report
from kvscope.analytics.report.model import Report, ReportParams
from kvscope.analytics.report.progress import QuietProgress, StepProgress
from kvscope.analytics.report.write import ReportFiles, write_report
from kvscope.collector.storage.client import Client
from kvscope.collector.storage.target import Target, connect

log = logging.getLogger(__name__)


def build_report(
    target: Target,
    out_dir: Path,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    model: str | None = None,
    target_hit_rate: float = 0.7,
    transfer_slo_ms: float = 100.0,
    sizing: dict[str, Any] | None = None,
    progress: StepProgress | None = None,
    client: Client | None = None,
) -> tuple[Report, ReportFiles]:
    """Write report.html, report.md (+ images/) and report.json for `target` into `out_dir`;
    return the figures and the files.

    `client` reuses an open clickhouse-connect client (the demo's); otherwise one is opened
    and closed here. `sizing` holds the optional `ReportParams` fields (kv_bytes_per_token,
    gpu_gib, prefill_tokens_per_gpu_s, min_transfers).
    """
    progress = progress or QuietProgress()
    params = ReportParams(since, until, model, target_hit_rate, transfer_slo_ms, **(sizing or {}))
    own = client is None
    if client is None:
        client = connect(target, create_database=False)
    try:
        log.info("building report from %s into %s", target, out_dir)
        report = gather_report(client, params, progress, now=datetime.now(UTC))
        progress.step("drawing plots, writing files")
        return report, write_report(report, out_dir)
    finally:
        if own:
            client.close()  # type: ignore[union-attr]

"""Dashboards as code: writes docker/grafana/dashboards/*.json from the panel list below.

Run `python docker/grafana/generate.py` after changing a panel or a file in sql/queries
(`--check` only compares; tests/unit/ops/test_grafana_dashboards.py does the same). A
ClickHouse panel is a tiny view over one analytics query: `SELECT <columns> FROM (<the
query's SQL>) AS q <tail>`, where the SQL is read from sql/queries at generation time and
its parameters become Grafana macros and dashboard variables (`PARAMETER_SQL`), so the
logic exists once. Prometheus panels read the recording rules of
docker/prometheus/kvscope.rules.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.analytics.queries import DEFAULTS, load_query

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
CLICKHOUSE = {"type": "grafana-clickhouse-datasource", "uid": "kvscope-clickhouse"}
PROMETHEUS = {"type": "prometheus", "uid": "kvscope-prometheus"}
PARAMETER_SQL: dict[str, str] = {
    "since": "$__fromTime_ms",
    "until": "$__toTime_ms",
    "instance": "${instance:sqlstring}",
    "model": "${model:sqlstring}",
    "bucket_s": "toUInt32(${bucket_s:sqlstring})",
    "slo_ms": "toFloat64(${slo_ms:sqlstring})",
    "fractions": repr([float(f) for f in DEFAULTS["fractions"]]),
    "limit": "100",
}
"""What each analytics-query parameter becomes in a panel: the ClickHouse plugin's time-range
macros, dashboard variables quoted by Grafana's `sqlstring` format (and cast back where the
query expects a number), or a constant."""
TABLE, TIME_SERIES = 1, 0
"""The plugin's `format` values (sqlds: 0 time series, 1 table)."""


@dataclass(frozen=True)
class SqlPanel:
    """A ClickHouse panel: `columns` of analytics query `query`, filtered/ordered by `tail`."""

    title: str
    query: str
    columns: tuple[str, ...]
    tail: str = ""
    kind: str = "table"
    unit: str = ""
    description: str = ""

    def raw_sql(self) -> str:
        """The panel's SQL: the query file's SQL with parameters as macros, wrapped in a view."""
        query = load_query(self.query)
        sql = query.sql
        for name, ch_type in query.params.items():
            sql = sql.replace(f"{{{name}:{ch_type}}}", PARAMETER_SQL[name])
        body = "\n".join(
            line for line in sql.strip().splitlines() if not line.lstrip().startswith("--")
        )
        tail = f"\n{self.tail}" if self.tail else ""
        return f"SELECT {', '.join(self.columns)}\nFROM (\n{body}\n) AS q{tail}"


@dataclass(frozen=True)
class PromPanel:
    """A Prometheus panel over recording rules (one expression per target, with legends)."""

    title: str
    exprs: tuple[tuple[str, str], ...]
    unit: str = ""
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    """One dashboard file: uid, title, variables it offers and its panels in reading order."""

    uid: str
    title: str
    description: str
    panels: tuple[SqlPanel | PromPanel, ...]
    variables: tuple[str, ...] = ("instance", "model", "bucket_s")
    tags: tuple[str, ...] = field(default=("kvscope",))


PER_INSTANCE = "WHERE instance != '*'"


def _per_pair(title: str, column: str, unit: str = "") -> SqlPanel:
    """A time series of one `transfer_latency` column per prefill -> decode pair."""
    columns = ("bucket", "src_instance", "dst_instance", column)
    return SqlPanel(title, "transfer_latency", columns, "ORDER BY bucket", "timeseries", unit)


DASHBOARDS: tuple[Dashboard, ...] = (
    Dashboard(
        uid="kvscope-fleet",
        title="kvscope / Fleet overview",
        description="Prefix-cache hit rate, block stores and evictions, KV usage, completeness.",
        panels=(
            SqlPanel(
                "Fleet prefix-cache hit rate",
                "hit_rate",
                ("hit_rate", "request_hit_rate"),
                "WHERE instance = '*'",
                kind="stat",
                unit="percentunit",
            ),
            SqlPanel(
                "Hit rate per instance",
                "hit_rate",
                ("instance", "dp_rank", "hit_rate", "request_hit_rate", "requests"),
                PER_INSTANCE,
                unit="percentunit",
            ),
            SqlPanel(
                "Block stores per bucket",
                "eviction_churn_timeline",
                ("bucket", "instance", "stores"),
                "ORDER BY bucket",
                kind="timeseries",
            ),
            SqlPanel(
                "Block removals (evictions) per second",
                "eviction_churn_timeline",
                ("bucket", "instance", "removals_per_s"),
                "ORDER BY bucket",
                kind="timeseries",
                unit="ops",
            ),
            SqlPanel(
                "KV-cache usage",
                "report_usage",
                ("t", "instance", "usage"),
                "ORDER BY t",
                kind="timeseries",
                unit="percentunit",
            ),
            SqlPanel(
                "Completeness per source and stream",
                "completeness",
                ("instance", "dp_rank", "stream", "completeness", "declared_lost"),
                "ORDER BY completeness, instance, stream",
                unit="percentunit",
                description="Share of each stream's seq range stored; declared_lost from Gaps.",
            ),
        ),
    ),
    Dashboard(
        uid="kvscope-instance",
        title="kvscope / Instance",
        description="One instance (the instance variable): churn, residency, refaults, what-if.",
        panels=(
            SqlPanel(
                "Eviction churn over time",
                "eviction_churn_timeline",
                ("bucket", "instance", "stores", "removals", "clears"),
                "ORDER BY bucket",
                kind="timeseries",
            ),
            SqlPanel(
                "Residency (seconds a block stays cached)",
                "residency",
                ("instance", "dp_rank", "intervals", "p50_s", "p90_s", "p99_s", "still_resident"),
                unit="s",
            ),
            SqlPanel(
                "Refaults",
                "refaults",
                ("instance", "dp_rank", "stores", "refaults", "refault_share", "distance_p50"),
            ),
            SqlPanel(
                "Routing opportunity",
                "routing_opportunity",
                ("instance", "dp_rank", "stores", "opportunity_blocks", "opportunity_share"),
            ),
            SqlPanel(
                "Capacity what-if: predicted hit rate with more blocks",
                "capacity_what_if",
                ("instance", "fraction", "extra_blocks", "hit_rate", "predicted_hit_rate"),
                PER_INSTANCE,
                unit="percentunit",
            ),
            SqlPanel(
                "Recent requests",
                "request_hit_rate",
                ("ts", "request_id", "instance", "prompt_tokens", "cached_tokens", "hit_rate"),
            ),
        ),
    ),
    Dashboard(
        uid="kvscope-transfers",
        title="kvscope / P/D KV transfers",
        description="Prefill -> decode KV transfers per pair: latency, throughput, SLO breaches.",
        variables=("instance", "model", "bucket_s", "slo_ms"),
        panels=(
            _per_pair("p50 transfer latency per pair", "p50_ms", "ms"),
            _per_pair("p99 transfer latency per pair", "p99_ms", "ms"),
            _per_pair("Throughput per pair (GB/s at p50)", "gbps_p50"),
            SqlPanel(
                "SLO breaches per pair (latency over slo_ms)",
                "report_transfer_breaches",
                ("src_instance", "dst_instance", "transfers", "breaches"),
            ),
            PromPanel(
                "p99 per pair, live (engines' kvscope_kv_transfer_latency_seconds)",
                (
                    (
                        "kvscope:kv_transfer_latency_seconds:p99_5m",
                        "{{src_instance}} -> {{dst_instance}} ({{backend}})",
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    Dashboard(
        uid="kvscope-pipeline",
        title="kvscope / Pipeline health",
        description="Publishers, bridges and collectors (Prometheus) and stream gaps (ClickHouse).",
        variables=("instance", "model"),
        panels=(
            PromPanel(
                "Publisher records dropped per second",
                (
                    (
                        "kvscope:publisher_dropped:rate5m",
                        "{{instance}} {{stream}} ({{reason}})",
                    ),
                ),
                unit="ops",
            ),
            PromPanel(
                "Publisher queue fill",
                (("kvscope:publisher_queue_fill:ratio", "{{instance}}"),),
                unit="percentunit",
            ),
            PromPanel(
                "Bridge batches lost per second",
                (("kvscope:bridge_lost_batches:rate5m", "{{endpoint}} ({{reason}})"),),
                unit="ops",
            ),
            PromPanel(
                "Collector lag (records behind)",
                (("kvscope:collector_lag_records:sum", "{{instance}} {{topic}}"),),
            ),
            PromPanel(
                "Collector paused partitions",
                (("kvscope_collector_paused_partitions", "{{instance}}"),),
            ),
            PromPanel(
                "Collector errors per second (decode = ingest_errors rows)",
                (("kvscope:collector_errors:rate5m", "{{instance}} {{kind}}"),),
                unit="ops",
            ),
            PromPanel(
                "Stream gaps per second",
                (("kvscope:collector_gaps:rate5m", "{{instance}} by {{detected_by}}"),),
                unit="ops",
            ),
            SqlPanel(
                "Sources with lost or missing records",
                "completeness",
                (
                    "instance",
                    "dp_rank",
                    "epoch",
                    "stream",
                    "declared_lost",
                    "undeclared_missing",
                    "completeness",
                ),
                "WHERE declared_lost > 0 OR undeclared_missing != 0 ORDER BY completeness",
                unit="percentunit",
            ),
        ),
    ),
)
"""Every dashboard kvscope ships, in file order."""


def _variable(name: str) -> dict[str, Any]:
    if name == "bucket_s":
        options = ["60", "300", "900", "3600"]
        return {
            "name": name,
            "label": "bucket (s)",
            "type": "custom",
            "query": ",".join(options),
            "current": {"text": "300", "value": "300"},
            "options": [{"text": o, "value": o, "selected": o == "300"} for o in options],
        }
    default = {"slo_ms": "500"}.get(name, "")
    label = {"instance": "instance ('' = all)", "model": "model ('' = all)", "slo_ms": "SLO (ms)"}
    return {
        "name": name,
        "label": label[name],
        "type": "textbox",
        "query": default,
        "current": {"text": default, "value": default},
    }


def _panel(panel: SqlPanel | PromPanel, panel_id: int) -> dict[str, Any]:
    width, height = 12, 8
    common: dict[str, Any] = {
        "id": panel_id,
        "title": panel.title,
        "description": panel.description,
        "gridPos": {
            "x": (panel_id - 1) % 2 * width,
            "y": (panel_id - 1) // 2 * height,
            "w": width,
            "h": height,
        },
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {},
    }
    if isinstance(panel, PromPanel):
        targets = [
            {"refId": chr(ord("A") + i), "datasource": PROMETHEUS, "expr": e, "legendFormat": f}
            for i, (e, f) in enumerate(panel.exprs)
        ]
        return {**common, "type": "timeseries", "datasource": PROMETHEUS, "targets": targets}
    target = {
        "refId": "A",
        "datasource": CLICKHOUSE,
        "editorType": "sql",
        "queryType": "timeseries" if panel.kind == "timeseries" else "table",
        "format": TIME_SERIES if panel.kind == "timeseries" else TABLE,
        "rawSql": panel.raw_sql(),
        "meta": {"kvscope": {"query": panel.query, "columns": list(panel.columns)}},
    }
    return {**common, "type": panel.kind, "datasource": CLICKHOUSE, "targets": [target]}


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard JSON model of `dashboard`."""
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "timezone": "utc",
        "editable": False,
        "schemaVersion": 39,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [_variable(v) for v in dashboard.variables]},
        "panels": [_panel(p, i) for i, p in enumerate(dashboard.panels, start=1)],
    }


def render_all() -> dict[str, str]:
    """File name -> file text for every dashboard (what the generator writes)."""
    return {
        f"{d.uid.removeprefix('kvscope-')}.json": json.dumps(render(d), indent=2) + "\n"
        for d in DASHBOARDS
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with --check, compare) docker/grafana/dashboards/*.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ")
    args = parser.parse_args(argv)
    files = render_all()
    stale = sorted(
        name
        for name, text in files.items()
        if not (OUT_DIR / name).is_file() or (OUT_DIR / name).read_text() != text
    )
    extra = sorted(p.name for p in OUT_DIR.glob("*.json") if p.name not in files)
    if args.check:
        for name in stale + extra:
            print(f"docker/grafana/dashboards/{name} is out of date; run {sys.argv[0]}")
        return 1 if stale or extra else 0
    OUT_DIR.mkdir(exist_ok=True)
    for name in stale:
        (OUT_DIR / name).write_text(files[name])
    for name in extra:
        (OUT_DIR / name).unlink()
    print(f"wrote {len(stale)} of {len(files)} dashboards to {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

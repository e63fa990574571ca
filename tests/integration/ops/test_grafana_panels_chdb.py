"""Every Grafana panel's SQL, macros expanded as Grafana would, on chDB with simulated data.

The dashboards come from docker/grafana/generate.py (the committed JSON equals its output:
tests/unit/ops/test_grafana_dashboards.py). Here each ClickHouse panel runs against tables
the fleet simulator filled, for several variable settings, and must return exactly the
columns the panel declares (DESCRIBE, so also when no row matches), and only rows the
underlying analytics query returns for the same parameters (the panel is a view over that
query, not a second copy of it).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from kvscope.analytics.queries import bind_params, load_query
from kvscope.collector.storage import residency
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import simulate_direct
from support.grafana_macros import expand

DASHBOARDS = Path(__file__).resolve().parents[3] / "docker" / "grafana" / "dashboards"
START = dt.datetime(2025, 12, 31, tzinfo=dt.UTC)
END = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
FAULT_ONLY = {"Sources with lost or missing records"}
"""Panels that list only problems; the simulated fleet has none, so they return no rows."""


def _panels() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            if panel["datasource"]["type"] == "grafana-clickhouse-datasource":
                found.append((f"{path.stem}: {panel['title']}", panel))
    return found


PANELS = _panels()


@pytest.fixture(scope="module")
def filled(chdb_path: Path) -> Iterator[Any]:
    """A chDB database with a simulated 2 prefill + 2 decode fleet (one slow pair)."""
    database = f"test_{uuid.uuid4().hex[:12]}"
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb_path}")
    client.command(f"CREATE DATABASE {database}")
    client.database = database
    migrate(client, parse_target(f"chdb://{chdb_path}?database={database}"))
    config = SimConfig(
        instances=parse_instances("2p,2d"),
        workload="zipf",
        routing="prefix-aware",
        requests=300,
        capacity_blocks=200,
        seed=5,
        slow_pair="prefill-0->decode-1",
    )
    simulate_direct(client, config)
    # Grafana reads the tables as they are: the collector keeps the residency derived
    # (every --residency-interval); the direct simulation has no collector, so derive here.
    residency.refresh(client)
    yield client
    client.command(f"DROP DATABASE {database}")
    client.close()


def test_every_dashboard_has_clickhouse_panels() -> None:
    assert {p.split(":")[0] for p, _ in PANELS} == {"fleet", "instance", "transfers", "pipeline"}


@pytest.mark.parametrize(
    "variables",
    [
        {"instance": "", "model": "", "bucket_s": "60", "slo_ms": "500"},
        {"instance": "decode-1", "model": "", "bucket_s": "3600", "slo_ms": "1"},
        {"instance": "it's", "model": "no'; DROP TABLE requests; --", "bucket_s": "300"},
    ],
    ids=["all", "one-instance", "quotes"],
)
@pytest.mark.parametrize(("title", "panel"), PANELS, ids=[t for t, _ in PANELS])
def test_panel_sql_runs_and_returns_its_columns(
    filled: Any, title: str, panel: dict, variables: dict[str, str]
) -> None:
    target = panel["targets"][0]
    meta = target["meta"]["kvscope"]
    variables = {"slo_ms": "500", **variables}
    sql = expand(target["rawSql"], start=START, end=END, variables=variables)
    described = [row[0] for row in filled.query(f"DESCRIBE ({sql})").result_rows]
    assert described == meta["columns"], title
    result = filled.query(sql)
    if result.result_rows:
        assert list(result.column_names) == meta["columns"], title
    params: dict[str, Any] = {"since": START, "until": END}
    params.update({k: v for k, v in variables.items() if k != "slo_ms"})
    params["slo_ms"] = float(variables["slo_ms"])
    params["limit"] = 100
    # Grafana runs the query's SQL only: compare with the SQL's rows, before any Python stage
    # (the what-if's access replay is applied by kvscope's own readers, not by Grafana).
    query = load_query(meta["query"])
    sql_result = filled.query(
        query.sql, parameters=bind_params(query, _only_known(meta["query"], params))
    )
    query_rows = [
        dict(zip(sql_result.column_names, r, strict=True)) for r in sql_result.result_rows
    ]
    projected = Counter(tuple(r[c] for c in meta["columns"]) for r in query_rows)
    panel_rows = Counter(tuple(_plain(v) for v in row) for row in result.result_rows)
    assert not panel_rows - Counter({_plain_key(k): n for k, n in projected.items()}), title
    if variables["instance"] == "" and title.split(": ", 1)[1] not in FAULT_ONLY:
        assert result.result_rows, f"{title}: no rows on a simulated fleet"
    assert filled.query("SELECT count() FROM requests").result_rows[0][0] > 0


def _only_known(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k in load_query(name).params}


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, float):
        return round(value, 9)
    return value


def _plain_key(key: tuple) -> tuple:
    return tuple(_plain(v) for v in key)

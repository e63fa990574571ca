"""What the serve's HTTP endpoints answer (HTTP itself: `kvscope.serve.app`).

Read-only and limited to the named queries of `sql/queries`: parameters are bound by
`queries.bind_params`, exactly as `kvscope query` binds them, and sent to ClickHouse as
server-side parameters. Every answer is an `Answer` (status, content type, body); bad
input is a 400 with a one-line JSON error.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvscope.analytics import queries
from kvscope.analytics.numbers import milliseconds, share
from kvscope.collector.storage import residency
from kvscope.collector.storage.client import Client
from kvscope.collector.storage.target import Target
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

JSON = "application/json; charset=utf-8"
REPORT_FIELDS = ("since", "until", "model", "target_hit_rate", "transfer_slo_ms", "format")
"""The parameters `/report` accepts."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """One HTTP answer: status code, content type and body."""

    status: int
    content_type: str
    body: bytes


ARROW_STREAM = "application/vnd.apache.arrow.stream"
"""Content type of an Arrow IPC stream."""
_TYPE_OF = {float: "Float64", int: "Int64", str: "String", bool: "Bool"}
"""ClickHouse type names of the columns a Python stage adds (see `queries.refine_rows`)."""


def json_answer(data: Any, status: int = 200) -> Answer:
    """`data` as strict JSON (nan and infinities become null)."""
    return Answer(status, JSON, json.dumps(_strict(data), allow_nan=False).encode())


def error_answer(message: str, status: int = 400) -> Answer:
    """A one-line JSON error."""
    return json_answer({"error": message}, status)


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


def _parameter(
    params: Mapping[str, str], name: str, parse: Callable[[str], float], default: str
) -> float:
    """Parameter `name` (or `default`) read by `parse`; `ConfigError` naming it otherwise."""
    try:
        return parse(params.get(name, default))
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


class ServeApi:
    """The endpoints' logic over one (serialized) clickhouse-connect client."""

    def __init__(self, client: Client, target: Target, started: float | None = None) -> None:
        self.client = client
        self.target = target
        self.started = started or time.time()
        self._report_lock = threading.Lock()

    def list_queries(self) -> Answer:
        """`/api/queries`: every named query with its description and parameter types."""
        return json_answer(
            [
                {"name": q.name, "description": q.description, "params": q.params}
                for q in queries.list_queries()
            ]
        )

    def run_query(self, name: str, params: Mapping[str, str]) -> Answer:
        """`/api/query/NAME`: the rows, their columns and ClickHouse types.

        Bound exactly as `kvscope query NAME --param K=V` binds them; a query over the
        materialized residency brings it up to date first, as a direct read does.
        """
        try:
            query = queries.load_query(name)
            bound = queries.bind_params(query, params)
        except ConfigError as exc:
            return error_answer(str(exc), 404 if "unknown query" in str(exc) else 400)
        if query.derived:  # as `queries.run_query` does: the collector may be behind, or off
            residency.refresh(self.client)
        columns, types, rows = queries.execute(self.client, query, bound)
        rows = queries.refine_rows(self.client, name, rows, bound)
        for extra in [key for key in (rows[0] if rows else {}) if key not in columns]:
            columns.append(extra)
            types.append(_TYPE_OF.get(type(rows[0][extra]), "String"))
        return json_answer(
            {"name": name, "params": bound, "columns": columns, "types": types, "rows": rows}
        )

    def index_snapshot(self, params: Mapping[str, str]) -> Answer:
        """`/api/index/snapshot?topic=T`: the stored state a `kvscope index` starts from, as
        Arrow IPC (`index.stored`), read on this serve's client (it owns the chDB directory)."""
        from kvscope.index.stored import read_snapshot, snapshot_ipc

        topic = params.get("topic", "")
        if not topic:
            return error_answer("topic is required: /api/index/snapshot?topic=kvscope.kv-events")
        return Answer(200, ARROW_STREAM, snapshot_ipc(read_snapshot(self.client, topic)))

    def collector_status(self) -> Answer:
        """`/api/collector`: the collector's counters (ingest, lag, errors) right now."""
        from prometheus_client import REGISTRY

        totals: dict[str, float] = {}
        for family in REGISTRY.collect():
            if not family.name.startswith("kvscope_collector_"):
                continue
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket")):
                    continue
                key = sample.name.removeprefix("kvscope_collector_")
                totals[key] = totals.get(key, 0.0) + sample.value
        return json_answer(
            {
                "time": time.time(),
                "uptime_s": time.time() - self.started,
                "rows_inserted": totals.get("rows_inserted_total", 0.0),
                "records_consumed": totals.get("records_consumed_total", 0.0),
                "lag_records": totals.get("lag_records", 0.0),
                "buffered_rows": totals.get("buffered_rows", 0.0),
                "errors": totals.get("errors_total", 0.0),
                "gaps": totals.get("gaps_total", 0.0),
                "paused_partitions": totals.get("paused_partitions", 0.0),
            }
        )

    def report(self, params: Mapping[str, str]) -> Answer:
        """`/report`: the capacity-planning report of a window, as HTML (default) or JSON."""
        from kvscope.analytics.report.build import build_report
        from kvscope.analytics.times import parse_time

        unknown = set(params) - set(REPORT_FIELDS)
        if unknown:
            return error_answer(
                f"/report has no parameter {', '.join(sorted(unknown))}; "
                f"it takes {', '.join(REPORT_FIELDS)}"
            )
        fmt = params.get("format", "html")
        if fmt not in ("html", "json"):
            return error_answer("format must be html or json")
        try:
            since = parse_time(params["since"]) if params.get("since") else None
            until = parse_time(params["until"]) if params.get("until") else None
            if since and until and since >= until:
                raise ConfigError("since must be before until")
            target_hit_rate = _parameter(params, "target_hit_rate", share, "0.7")
            slo_ms = _parameter(params, "transfer_slo_ms", milliseconds, "50")
        except ConfigError as exc:
            return error_answer(str(exc))
        with self._report_lock, tempfile.TemporaryDirectory(prefix="kvscope-report-") as out:
            _, files = build_report(
                self.target,
                Path(out),
                since=since,
                until=until,
                model=params.get("model") or None,
                target_hit_rate=target_hit_rate,
                transfer_slo_ms=slo_ms,
                client=self.client,
            )
            if fmt == "json":
                return Answer(200, JSON, files.json.read_bytes())
            return Answer(200, "text/html; charset=utf-8", files.html.read_bytes())

"""`kvscope serve` with the real broker and chDB, as a user runs it (subprocesses).

While the serve collects, `kvscope query` and `kvscope report` on the same chDB directory
(separate processes) read through it and answer exactly what the HTTP API answers; once
it stopped, the same commands read the directory directly and print the same bytes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kvscope.serve.state import STATE_FILE, read_state
from support.serve_kit import ServeProcess, kvscope, publish_fleet

VISIBLE_WITHIN_S = 3.0
"""Rows published must be queryable within this long (the issue's freshness bound)."""
QUERIES = {
    "hit_rate": {},
    "completeness": {},
    "transfer_latency": {"bucket_s": "60"},
}
"""Compared API vs CLI in JSON; the first also as table and CSV (a CLI run costs seconds)."""


def stored_per_stream(serve: ServeProcess, since: str) -> Counter[str]:
    """Envelopes stored per stream, from the completeness query through the API."""
    rows = serve.get_json(f"/api/query/completeness?since={since}")["rows"]
    stored: Counter[str] = Counter()
    for row in rows:
        stored[row["stream"]] += row["present"]
    return stored


def wait_visible(
    serve: ServeProcess, since: str, sent: Counter[str], published_at: float, within_s: float
) -> None:
    """Poll the API until every published envelope is stored, at most `within_s` after
    `published_at`."""
    deadline = published_at + within_s
    while True:
        stored = stored_per_stream(serve, since)
        if stored == sent:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"published rows not queryable within {within_s} s: sent {dict(sent)}, "
                f"stored {dict(stored)}\n{serve.output()[-3000:]}"
            )
        time.sleep(0.05)


def cli_query(clickhouse: str, name: str, fmt: str, params: dict[str, str]) -> str:
    args = ["query", name, "--clickhouse", clickhouse, "--format", fmt]
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    result = kvscope(*args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def report_json(clickhouse: str, out: Path, since: str, until: str) -> dict:
    args = ["report", "--clickhouse", clickhouse, "--since", since, "--until", until]
    result = kvscope(*args, "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "report.json").read_text())
    data.pop("generated_at")
    return data


@pytest.mark.parametrize("instances,requests", [("1p,1d", 24), ("2p,1d", 40)])
def test_query_and_report_read_through_a_live_serve(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path, instances: str, requests: int
) -> None:
    chdb_dir = tmp_path / "chdb"
    start = time.time() - requests / 4.0 - 1
    since = datetime.fromtimestamp(start - 60, UTC).replace(tzinfo=None).isoformat()
    until = (datetime.now(UTC) + timedelta(minutes=5)).replace(tzinfo=None).isoformat()
    window = {"since": since, "until": until}
    with ServeProcess(bootstrap_servers, chdb_dir, topic_prefix) as serve:
        # Warm-up: the first records create the topics, which the collector's group then
        # joins (seconds). Freshness is measured on the running pipeline after that.
        warm = publish_fleet(bootstrap_servers, topic_prefix, requests=4, seed=99, start_ts=start)
        wait_visible(serve, since, warm, time.monotonic(), within_s=60)
        serve.wait_assigned("engine-histograms")
        sent = publish_fleet(
            bootstrap_servers, topic_prefix, requests=requests, instances=instances, start_ts=start
        )
        wait_visible(serve, since, warm + sent, time.monotonic(), VISIBLE_WITHIN_S)

        through_serve = {}
        for name, extra in QUERIES.items():
            params = {**window, **extra}
            api = serve.get_json(
                f"/api/query/{name}?" + "&".join(f"{k}={v}" for k, v in params.items())
            )
            text = cli_query(serve.clickhouse, name, "json", params)
            assert json.loads(text) == api["rows"], name
            assert api["rows"], f"{name} returned no rows"
            through_serve[name] = {"json": text}
            if name == "hit_rate":
                for fmt in ("table", "csv"):
                    through_serve[name][fmt] = cli_query(serve.clickhouse, name, fmt, params)

        status, body = serve.get(f"/report?since={since}&until={until}&format=json")
        assert status == 200, body[:300]
        api_report = json.loads(body)
        api_report.pop("generated_at")
        live_report = report_json(serve.clickhouse, tmp_path / "r1", since, until)
        assert live_report == api_report
        assert len(live_report["instances"]) == sum(int(n[:-1]) for n in instances.split(","))
        assert (chdb_dir / STATE_FILE).stat().st_mode & 0o777 == 0o600
        # Another database of the held directory: it was ignored (the serve's was read).
        other = kvscope("query", "hit_rate", "--clickhouse", f"{serve.clickhouse}?database=nope")
        assert other.returncode == 2, other.stderr
        assert other.stderr.count("\n") == 1, other.stderr
        assert "serves database 'kvscope', not 'nope'" in other.stderr
    assert serve.process is not None and serve.process.returncode == 0, serve.output()
    assert read_state(chdb_dir) is None, "the serve left its record behind"

    # Stopped: the same commands open the directory themselves and print the same bytes.
    for name, extra in QUERIES.items():
        params = {**window, **extra}
        for fmt, text in through_serve[name].items():
            assert cli_query(f"chdb://{chdb_dir}", name, fmt, params) == text, (name, fmt)
    assert report_json(f"chdb://{chdb_dir}", tmp_path / "r2", since, until) == live_report


def test_token_guards_every_route_but_healthz(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    token = "s3cret-token-for-tests"
    with ServeProcess(
        bootstrap_servers,
        tmp_path / "chdb",
        topic_prefix,
        "--host",
        "0.0.0.0",
        env={"KVSCOPE_SERVE_TOKEN": token},
    ) as serve:
        assert serve.token == token
        assert serve.get("/healthz", token="")[0] == 200
        for path in (
            "/",
            "/api/queries",
            "/api/query/hit_rate",
            "/metrics",
            "/report",
            "/static/dashboard.js",
        ):
            assert serve.get(path, token="")[0] == 401, path
            assert serve.get(path, token="wrong-token-of-same-size")[0] == 401, path
        assert serve.get("/api/queries")[0] == 200
        assert serve.get("/api/query/hit_rate?token=" + token, token="")[0] == 200
        # The reader takes the token from the serve's record (mode 0600) transparently,
        # also when the environment holds another serve's token.
        for env in ({}, {"KVSCOPE_SERVE_TOKEN": "another-serve-s-token"}):
            result = kvscope(
                "query", "hit_rate", "--clickhouse", serve.clickhouse, "--format", "json", env=env
            )
            assert result.returncode == 0, (env, result.stderr)
            assert token not in result.stdout + result.stderr
    assert token not in serve.output()


def test_the_serialized_client_has_every_client_method_the_storage_code_calls(
    clickhouse: Any,
) -> None:
    """The sink repairs a cut insert with `query_arrow`; serve's client lacked it."""
    from kvscope.collector.storage.client import Client
    from kvscope.serve.service import SerializedClient

    wanted = {n for n in vars(Client) if not n.startswith("_")}
    serialized = SerializedClient(clickhouse)
    assert {n for n in wanted if not hasattr(serialized, n)} == set()
    assert serialized.query_arrow("SELECT 41 + 1 AS x").column("x").to_pylist() == [42]
    assert serialized.database == clickhouse.database

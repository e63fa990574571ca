"""The serve's HTTP API given odd or bad parameters: a 400 with one line of JSON, never a 500.

The serve's app (on the HTTP base's uvicorn) over a `ServeApi` on the session's chDB (a
fresh migrated database holding a small simulated fleet), requested over HTTP as the
dashboard or curl does.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kvscope.analytics.queries import format_rows, run_query
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.serve.api import ServeApi
from kvscope.serve.app import build_serve_app
from kvscope.serve.service import SerializedClient
from kvscope.simulator.fleet import SimConfig
from support.analytics_kit import run_direct
from support.live_http import live

START_TS = 1767225600.0
"""2026-01-01T00:00:00Z: the simulated fleet's first record."""


@pytest.fixture
def api_url(clickhouse: Any, clickhouse_url: str) -> Iterator[str]:
    """The URL of a serve's HTTP API over a database holding a small simulated fleet."""
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    run_direct(clickhouse, SimConfig(requests=20, start_ts=START_TS))
    with live(build_serve_app(ServeApi(SerializedClient(clickhouse), target), None)) as url:
        yield url


def get(url: str) -> tuple[int, Any]:
    """GET `url`: the status and the parsed JSON answer."""
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    "path,needle",
    [
        ("/api/query/hit_rate?since=99999999d", "cannot read time"),
        ("/report?since=99999999d&format=json", "cannot read time"),
        ("/api/query/hit_rate?since=1h&until=2h", "must be before until"),
        ("/api/query/hit_rate?since=2h&since=1h", "since given more than once"),
        ("/report?format=json&target_hit_rate=abc", "target_hit_rate: give a share between 0"),
        ("/report?format=json&target_hit_rate=0", "target_hit_rate: give a share between 0"),
        ("/report?format=json&transfer_slo_ms=inf", "transfer_slo_ms: give a number of millis"),
        ("/report?format=json&transfer_slo_ms=-1", "transfer_slo_ms: give a number of millis"),
        ("/report?format=json&until=1h&format=html", "format given more than once"),
        ("/api/query/residency?since=2030-01-01", "must be before until (20"),
        ("/api/query/completeness?since=2026-01-01&until=2026-01-01", "must be before until"),
        ("/report?model=no-such-model&format=json", "no kvscope data in this window for model"),
    ],
)
def test_bad_parameters_are_one_line_400s(api_url: str, path: str, needle: str) -> None:
    status, answer = get(api_url + path)
    assert status == 400, answer
    assert needle in answer["error"] and "\n" not in answer["error"], answer
    assert "--" not in answer["error"], "a command-line flag named over HTTP"


@pytest.mark.parametrize(
    "outside,inside",
    [
        ("since=0001-01-01", "since=1900-01-01"),
        ("since=0001-01-01T00:00:00%2B01:00", "since=1900-01-01"),
        ("until=9999-12-31T23:59:59-01:00", "until=2299-12-31T23:59:59.999999"),
    ],
)
def test_times_beyond_clickhouse_range_read_as_its_ends(
    api_url: str, outside: str, inside: str
) -> None:
    fixed = "" if "until" in outside else "&until=2100-01-01"  # residency ages run to until
    for name in ("hit_rate", "residency"):
        status, answer = get(f"{api_url}/api/query/{name}?{outside}{fixed}")
        assert status == 200, answer
        expected = get(f"{api_url}/api/query/{name}?{inside}{fixed}")[1]["rows"]
        assert answer["rows"] == expected, name
    status, answer = get(f"{api_url}/report?{outside}&format=json")
    assert status in (200, 400), answer
    if status == 400:
        assert answer["error"].startswith("no kvscope data"), answer


def test_head_answers_like_get_without_a_body_and_other_methods_get_a_json_405(
    api_url: str,
) -> None:
    for path in ("/healthz", "/api/queries"):
        with urllib.request.urlopen(urllib.request.Request(api_url + path, method="HEAD")) as reply:
            assert reply.status == 200 and reply.read() == b"", path
            assert int(reply.headers["Content-Length"]) > 0, path
    for method in ("POST", "OPTIONS"):
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(urllib.request.Request(api_url + "/healthz", method=method))
        assert failed.value.code == 405, method
        error = json.loads(failed.value.read())["error"]
        assert error == f"{method} /healthz: Method Not Allowed (it takes GET, HEAD)", method


def test_a_repeated_what_if_fraction_is_read_once(api_url: str) -> None:
    """0.5,0.5 summed each source's capacity, queries and hits twice into one row."""
    status, once = get(f"{api_url}/api/query/capacity_what_if?fractions=0.5&until=2100-01-01")
    assert status == 200 and once["rows"], once
    twice = get(f"{api_url}/api/query/capacity_what_if?fractions=0.5,0.5&until=2100-01-01")[1]
    assert twice["rows"] == once["rows"]


def test_an_answer_without_rows_names_its_columns_and_types(api_url: str) -> None:
    full = get(f"{api_url}/api/query/eviction_churn?until=2100-01-01")[1]
    empty = get(f"{api_url}/api/query/eviction_churn?since=2030-01-01&until=2031-01-01")[1]
    assert full["rows"] and not empty["rows"]
    assert (empty["columns"], empty["types"]) == (full["columns"], full["types"])


def test_residency_queries_see_every_stored_event(api_url: str, clickhouse: Any) -> None:
    """The API brings the derived tables up to date as a direct read does: with the
    collector's refresher off (serve --no-residency) or behind, it answered no rows."""
    params = {"until": "2100-01-01T00:00:00"}
    for name in ("residency", "refaults"):
        status, answer = get(f"{api_url}/api/query/{name}?until={params['until']}")
        assert status == 200 and answer["rows"], (name, answer)
        direct = json.loads(format_rows(run_query(clickhouse, name, params), "json"))
        assert answer["rows"] == direct, name


def test_the_api_listens_on_ipv6_loopback(clickhouse: Any, clickhouse_url: str) -> None:
    """`serve --host ::1` (loopback, so no token) failed: 'Address family for hostname not
    supported'."""
    api = ServeApi(SerializedClient(clickhouse), parse_target(clickhouse_url))
    with (
        live(build_serve_app(api, None), host="::1") as url,
        urllib.request.urlopen(f"{url}/healthz", timeout=10) as reply,
    ):
        assert json.loads(reply.read()) == {"ok": True}


@pytest.mark.parametrize(
    "request_line",
    [
        b"GARBAGE",
        b"GET /healthz?token=s3cret-in-the-line HTTP/1.1 extra",
        b"GET /healthz HTTP/9.9",
        b"GET /" + b"x" * 70_000 + b" HTTP/1.1",
    ],
)
def test_a_request_line_that_cannot_be_read_is_answered(
    api_url: str, request_line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A line the server cannot read gets a 400 and closes; the log never quotes the line
    (it may carry ?token=) and has no error in it."""
    caplog.set_level(logging.DEBUG)
    host, port = api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_line + b"\r\n\r\n")
        answer = sock.recv(200)
    assert answer.split()[1] == b"400", answer
    assert "s3cret" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_report_numbers_read_as_the_command_reads_them(api_url: str) -> None:
    """An SLO of 0 (every transfer a breach) and a target given in percent: `kvscope report`
    took both, /report refused the first and read `70%` as no number."""
    status, answer = get(f"{api_url}/report?format=json&transfer_slo_ms=0&target_hit_rate=70%25")
    assert status == 200, answer
    assert (answer["params"]["transfer_slo_ms"], answer["params"]["target_hit_rate"]) == (0, 0.7)

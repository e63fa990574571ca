"""The serve's small parts without a broker: options, token check, state record, wire values."""

from __future__ import annotations

import datetime as dt
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kvscope.analytics import queries
from kvscope.common.net import connectable_url, is_loopback
from kvscope.schemas.errors import ConfigError
from kvscope.serve.access import check_kafka
from kvscope.serve.app import build_serve_app, static_file
from kvscope.serve.remote import decode_value, wire_value
from kvscope.serve.service import ServeOptions
from kvscope.serve.state import (
    STATE_FILE,
    ServeState,
    _redacted,
    holder_pid,
    live_serve,
    read_state,
    remove_state,
    write_state,
)
from support.live_http import live

TOKEN = "a-token-of-20-chars!"


@pytest.mark.parametrize(
    "host,token,ok",
    [
        ("127.0.0.1", None, True),
        ("localhost", None, True),
        ("::1", None, True),
        ("127.0.0.2", None, True),
        ("0.0.0.0", None, False),
        ("10.1.2.3", None, False),
        ("example.org", None, False),
        ("0.0.0.0", TOKEN, True),
        ("0.0.0.0", "short", False),
        ("0.0.0.0", "pässwordpässword1", False),
        ("0.0.0.0", "sixteen chars ok", False),
        ("0.0.0.0", TOKEN + "\n", False),
    ],
)
def test_non_loopback_needs_a_token(host: str, token: str | None, ok: bool) -> None:
    options = ServeOptions(host=host, port=0, token=token)
    if ok:
        assert options.validate() is options
    else:
        with pytest.raises(ConfigError):
            options.validate()
    assert is_loopback(host) == (host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"))


@pytest.mark.parametrize(("host", "loopback"), [("[::1]", True), ("[::]", False), ("[", False)])
def test_an_ipv6_host_in_url_brackets_is_the_same_host(host: str, loopback: bool) -> None:
    """`--host [::1]` was refused as not loopback, then as an unknown name."""
    options = ServeOptions(host=host, port=0)
    if loopback:
        assert options.validate() is options
    else:
        with pytest.raises(ConfigError, match="is not loopback"):
            options.validate()


@pytest.mark.parametrize("port", [-1, 65536, 100000])
def test_port_range(port: int) -> None:
    with pytest.raises(ConfigError, match="--port"):
        ServeOptions(port=port).validate()


@pytest.mark.parametrize(
    "host,url",
    [
        ("0.0.0.0", "http://127.0.0.1:8765"),
        ("::", "http://127.0.0.1:8765"),
        ("::1", "http://[::1]:8765"),
        ("10.0.0.5", "http://10.0.0.5:8765"),
    ],
)
def test_recorded_url_is_connectable(host: str, url: str) -> None:
    assert connectable_url(host, 8765) == url


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str | None, str]]:
    """The serve's app with and without a token, on the HTTP base's uvicorn. No route used
    here reaches the API (none is given): /metrics, /healthz and the static files."""
    with live(build_serve_app(None, TOKEN)) as closed, live(build_serve_app(None, None)) as open_:  # type: ignore[arg-type]
        yield {TOKEN: closed, None: open_}


@pytest.mark.parametrize(
    "configured,header,query,ok",
    [
        (None, None, "", True),
        (TOKEN, None, "", False),
        (TOKEN, f"Bearer {TOKEN}", "", True),
        (TOKEN, f"bearer {TOKEN}", "", True),
        (TOKEN, "Bearer wrong", "", False),
        (TOKEN, f"Basic {TOKEN}", "", False),
        (TOKEN, None, f"?token={TOKEN}", True),
        (TOKEN, None, f"?token={TOKEN[:-1]}", False),
        (TOKEN, None, f"?token={TOKEN}&token={TOKEN}", False),
        (TOKEN, None, f"?tokens={TOKEN}", False),
        (TOKEN, "Bearer", "", False),
    ],
)
def test_token_check(
    urls: dict[str | None, str], configured: str | None, header: str | None, query: str, ok: bool
) -> None:
    headers = {"Authorization": header} if header else {}
    answer = httpx.get(f"{urls[configured]}/metrics{query}", headers=headers)
    assert answer.status_code == (200 if ok else 401), answer.text
    assert answer.headers["x-content-type-options"] == "nosniff"  # on refusals too
    assert httpx.get(f"{urls[configured]}/healthz").json() == {"ok": True}


@pytest.mark.parametrize(
    "path,status,needle",
    [
        ("/", 200, b"<html"),
        ("/static/dashboard.js", 200, b"token"),
        ("/static/nope.js", 404, b"no dashboard file"),
        ("/static/..%2Fapi.py", 404, b"Not Found"),
        ("/static/x.js?since=1&since=2", 400, b"since given more than once"),
        ("/static/x.js?model=" + "m" * 2000, 400, b"longer than"),
        ("/nope", 404, b"GET /nope: Not Found"),
    ],
)
def test_pages_and_strict_parameters(
    urls: dict[str | None, str], path: str, status: int, needle: bytes
) -> None:
    answer = httpx.get(urls[None] + path)
    assert answer.status_code == status and needle in answer.content, answer.text[:200]
    assert "default-src 'self'" in answer.headers["content-security-policy"]


@pytest.mark.parametrize(
    "name", ["index.html", "dashboard.js", "dashboard.css", "uPlot.iife.min.js"]
)
def test_dashboard_files_ship_in_the_package(name: str) -> None:
    answer = static_file(name)
    assert answer is not None and answer.status == 200 and len(answer.body) > 100
    assert b"http://" not in answer.body.replace(b"http://www.w3.org/2000/svg", b"")


@pytest.mark.parametrize(
    "name", ["../api.py", "..", ".hidden.js", "api.py", "nope.js", "a/b.js", ""]
)
def test_static_refuses_anything_else(name: str) -> None:
    assert static_file(name) is None


def test_state_record_is_private_and_only_its_writer_removes_it(tmp_path: Path) -> None:
    state = ServeState(url="http://127.0.0.1:1", pid=os.getpid(), token=TOKEN)
    path = write_state(tmp_path, state)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_state(tmp_path) == state
    assert TOKEN not in repr(state)
    remove_state(tmp_path, pid=os.getpid() + 1)
    assert read_state(tmp_path) == state
    # A record naming a live pid whose URL does not answer is not a live serve.
    assert live_serve(tmp_path) is None
    remove_state(tmp_path)
    assert not (tmp_path / STATE_FILE).exists()


@pytest.mark.parametrize("content", ["", "{", "[]", '{"url": 1}', '{"pid": "x", "url": "u"}'])
def test_unreadable_record_is_ignored(tmp_path: Path, content: str) -> None:
    (tmp_path / STATE_FILE).write_text(content)
    assert read_state(tmp_path) is None


def test_free_directory_has_no_holder(tmp_path: Path) -> None:
    assert holder_pid(tmp_path) is None
    (tmp_path / "status").write_text("PID: 1\n")
    assert holder_pid(tmp_path) is None  # present but not locked: nobody holds it


@pytest.mark.parametrize(
    "words,shown",
    [
        (["kvscope", "serve", "--token", "abc"], "kvscope serve --token ***"),
        (["kvscope", "serve", "--token=abc"], "kvscope serve --token=***"),
        (["kvscope", "query", "--clickhouse", "http://u:pw@h:8123/db"], "http://u:***@h:8123/db"),
        (["kvscope", "collect"], "kvscope collect"),
    ],
)
def test_process_names_hide_secrets(words: list[str], shown: str) -> None:
    text = " ".join(_redacted(words))
    assert shown in text
    assert "abc" not in text and "pw@" not in text


@pytest.mark.parametrize(
    "name,params",
    [
        ("hit_rate", {"since": "2026-11-20T10:00:00", "until": "2026-11-21T10:00:00.123456"}),
        ("capacity_what_if", {"fractions": "0.1,0.25,1.5"}),
        ("transfer_latency", {"bucket_s": "120", "instance": "decode-0"}),
        ("report_transfer_breaches", {"slo_ms": "12.5"}),
    ],
)
def test_wire_values_bind_back_to_the_same_values(name: str, params: dict[str, str]) -> None:
    query = queries.load_query(name)
    bound = queries.bind_params(query, params)
    again = queries.bind_params(query, {k: wire_value(v) for k, v in bound.items()})
    assert again == bound


@pytest.mark.parametrize(
    "ch_type,value,expected",
    [
        ("DateTime64(6)", "2026-11-20T10:00:00.5", dt.datetime(2026, 11, 20, 10, 0, 0, 500000)),
        ("DateTime('UTC')", "2026-11-20T10:00:00", dt.datetime(2026, 11, 20, 10)),
        ("Date", "2026-11-20", dt.date(2026, 11, 20)),
        ("Nullable(Float64)", None, None),
        ("Nullable(Float64)", 0.5, 0.5),
        ("Float32", None, "nan"),
        ("Array(Float64)", [1.0, None], [1.0, "nan"]),
        ("LowCardinality(String)", "x", "x"),
        ("UInt64", 2**63, 2**63),
        ("Nullable(DateTime64(6))", None, None),
    ],
)
def test_decode_value(ch_type: str, value: object, expected: object) -> None:
    got = decode_value(ch_type, value)
    if expected == "nan":
        assert isinstance(got, float) and math.isnan(got)
    elif isinstance(expected, list):
        assert isinstance(got, list) and got[0] == expected[0] and math.isnan(got[1])
    else:
        assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("server", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "[::1]:"])
def test_check_kafka_refuses_a_port_outside_1_to_65535_before_connecting(server: str) -> None:
    """Before, port 99999 reached the socket and was reported as "connection refused"."""
    with pytest.raises(ConfigError, match=r"use host:port \(port 1\.\.65535\)"):
        check_kafka(f"localhost:9092,{server}")

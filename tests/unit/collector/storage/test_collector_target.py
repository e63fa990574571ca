"""The ClickHouse target URL: parsing is pinned table-driven; passwords never leak."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvscope.collector.storage.target import DEFAULT_DATABASE, Target, parse_target
from kvscope.schemas.errors import ConfigError

CASES = [
    (
        "http://alice:s3cret@ch.example:8123/metrics",
        Target("http", "metrics", "ch.example", 8123, "alice", "s3cret"),
    ),
    ("http://ch.example", Target("http", DEFAULT_DATABASE, "ch.example", 8123, "default", "")),
    ("https://bob@ch.example/", Target("https", DEFAULT_DATABASE, "ch.example", 8443, "bob", "")),
    (
        "https://u:p%40ss@h:9440?database=x",
        Target("https", "x", "h", 9440, "u", "p@ss"),
    ),
    ("chdb:///var/lib/kv", Target("chdb", DEFAULT_DATABASE, path="/var/lib/kv")),
    ("chdb:///var/lib/kv?database=t_1", Target("chdb", "t_1", path="/var/lib/kv")),
]


@pytest.mark.parametrize(("url", "expected"), CASES)
def test_parse(url: str, expected: Target) -> None:
    assert parse_target(url) == expected


def test_relative_chdb_path_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_target("chdb://data/ch").path == str(tmp_path / "data" / "ch")


def test_default_is_env_then_chdb_in_xdg_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVSCOPE_CLICKHOUSE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert parse_target(None) == Target("chdb", path=str(tmp_path / "kvscope" / "chdb"))
    monkeypatch.setenv("KVSCOPE_CLICKHOUSE_URL", "http://h:1/d")
    assert parse_target(None).host == "h"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://h/db",
        "http:///db",
        "http://h:99999/db",
        "http://h:0/db",
        "http://h:-1/db",
        "http://u:pw@[::1:8123/db",
        "http://u:pw@[not-ipv6]:8123/db",
        "http://h/bad-name",
        "chdb://",
        "chdb:///",
        "chdb:///?database=kv",
        "chdb:///tmp/..",
        "chdb:///x?databse=kv",
        "http://h:8123/?databse=kv",
        "chdb:///x?database=a;drop",
        "chdb:///x?database=a%0A",
        "http://h/db%0A",
        "chdb:///x?database=system",
        "chdb:///x?database=INFORMATION_SCHEMA",
        "http://h/information_schema",
        "http://h/System",
        "chdb:///x?database=" + "d" * 300,
    ],
)
def test_rejects(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_target(url)


def test_password_is_masked() -> None:
    target = parse_target("http://alice:hunter2@h:8123/db")
    assert target.password == "hunter2"
    for text in (repr(target), str(target), target.safe_url):
        assert "hunter2" not in text
    assert target.safe_url == "http://alice:***@h:8123/db"


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:hunter2@[::1:8123/db",
        "http://alice:hunter2@h:0/db",
        "http://alice:hunter2@h/a-b",
    ],
)
def test_a_bad_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_target(url)
    assert "hunter2" not in str(refused.value)

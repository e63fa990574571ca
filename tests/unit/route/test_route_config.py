"""`kvscope route`'s settings: the --engines mapping to instance names, and validation."""

from __future__ import annotations

import socket

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.route.config import EngineSpec, RouteConfig, instance_name, parse_engines
from kvscope.schemas.errors import ConfigError

HOST = socket.gethostname()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://127.0.0.1:8000", [(f"{HOST}:8000", "http://127.0.0.1:8000")]),
        ("http://localhost:8001/", [(f"{HOST}:8001", "http://localhost:8001")]),
        ("http://[::1]:9", [(f"{HOST}:9", "http://[::1]:9")]),
        ("http://10.0.0.5:8000", [("10.0.0.5:8000", "http://10.0.0.5:8000")]),
        ("https://gpu-3.example", [("gpu-3.example:443", "https://gpu-3.example")]),
        ("http://gpu-3", [("gpu-3:80", "http://gpu-3")]),
        (
            "a=http://h:1, b=http://h:2 ,http://k:3",
            [("a", "http://h:1"), ("b", "http://h:2"), ("k:3", "http://k:3")],
        ),
        ("pod-0/x=http://h:1,", [("pod-0/x", "http://h:1")]),
    ],
)
def test_engines_are_named_as_the_plugin_names_them(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert parse_engines(text) == tuple(EngineSpec(n, u) for n, u in expected)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "at least one"),
        (" , ", "at least one"),
        ("127.0.0.1:8000", "not an http"),
        ("ftp://h:1", "not an http"),
        ("http://h:port", "not a URL"),
        ("a=http://h:1,a=http://h:2", "same name twice: a"),
        ("http://h:1,x=http://h:1", "same URL twice"),
        ("http://127.0.0.1:5,http://localhost:5", "same name twice"),
    ],
)
def test_bad_engines_name_the_flag(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="--engines") as caught:
        parse_engines(text)
    assert says in str(caught.value)


def test_instance_name_of_a_remote_engine_keeps_its_host() -> None:
    assert instance_name("http://engine-7.internal:8000") == "engine-7.internal:8000"


ENGINES = (EngineSpec("a", "http://127.0.0.1:1"),)


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"engines": ()}, "--engines"),
        ({"port": 70000}, "--port"),
        ({"affinity": 1.5}, "--affinity"),
        ({"affinity": -0.1}, "--affinity"),
        ({"connect_timeout_s": 0}, "--connect-timeout"),
        ({"request_timeout_s": -1}, "--request-timeout"),
        ({"index_timeout_s": 0}, "--index-timeout"),
        ({"down_s": 0}, "--down-seconds"),
        ({"health_interval_s": 0}, "--health-interval"),
        ({"index_url": "localhost:8200"}, "--index"),
        (
            {
                "index_url": "http://idx:8200",
                "embedded_index": IndexConfig(KafkaSettings(bootstrap_servers="b:9092")),
            },
            "--index-bootstrap-servers",
        ),
        (
            {
                "embedded_index": IndexConfig(
                    KafkaSettings(bootstrap_servers="b:9092"), topic_prefix="a b"
                )
            },
            "prefix",
        ),
        (
            {
                "embedded_index": IndexConfig(
                    KafkaSettings(bootstrap_servers="b:9092"), hash_algo="md5"
                )
            },
            "--hash-algo",
        ),
        ({"token": "short"}, "--token"),
        ({"token": "a token with spaces in it"}, "--token"),
        ({"host": "0.0.0.0"}, "--host"),
    ],
)
def test_validate_names_the_flag(change: dict[str, object], flag: str) -> None:
    config = RouteConfig(**{"engines": ENGINES, **change})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=flag):
        config.validate()


def test_valid_settings_pass() -> None:
    config = RouteConfig(
        engines=ENGINES, host="0.0.0.0", token="x" * 16, index_url="http://idx:8200"
    )
    assert config.validate() is config
    embedded = RouteConfig(
        engines=ENGINES, embedded_index=IndexConfig(KafkaSettings(bootstrap_servers="b:9092"))
    )
    assert embedded.validate() is embedded

"""Every listener (serve, index, route) takes the same tokens and refuses the same ones
with the same one-line reason, before anything starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.common.net import MIN_TOKEN_CHARS, token_problem
from kvscope.index.config import IndexConfig
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.schemas.errors import ConfigError
from kvscope.serve.service import ServeOptions

LISTENERS: dict[str, Callable[[str, str], Any]] = {
    "serve": lambda host, token: ServeOptions(host=host, token=token),
    "index": lambda host, token: IndexConfig(
        KafkaSettings(bootstrap_servers="127.0.0.1:9092"), host=host, token=token
    ),
    "route": lambda host, token: RouteConfig(
        engines=(EngineSpec("e0", "http://127.0.0.1:8000"),), host=host, token=token
    ),
}
GOOD = ["a" * MIN_TOKEN_CHARS, "x" * 64, "Zq9!~#$%&'()*+,-./:;<=>?@[]^_`{|}"]
BAD = [
    "",
    "a" * (MIN_TOKEN_CHARS - 1),
    "with a space inside it",
    "tab\there-and-long-enough",
    "naïve-but-long-enough-token",
    "emoji-🔑-long-enough-token",
    "a" * MIN_TOKEN_CHARS + "\n",
]


@pytest.mark.parametrize("listener", sorted(LISTENERS))
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::"])
@pytest.mark.parametrize("token", GOOD)
def test_a_good_token_is_taken_on_any_address(listener: str, host: str, token: str) -> None:
    assert token_problem(token) is None
    LISTENERS[listener](host, token).validate()


@pytest.mark.parametrize("listener", sorted(LISTENERS))
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
@pytest.mark.parametrize("token", BAD)
def test_a_bad_token_is_refused_in_one_line(listener: str, host: str, token: str) -> None:
    problem = token_problem(token)
    assert problem is not None and "\n" not in problem
    with pytest.raises(ConfigError) as refused:
        LISTENERS[listener](host, token).validate()
    assert str(refused.value) == problem


@pytest.mark.parametrize("listener", sorted(LISTENERS))
def test_no_token_is_fine_on_loopback_only(listener: str) -> None:
    assert token_problem(None) is None
    LISTENERS[listener]("127.0.0.1", None).validate()
    with pytest.raises(ConfigError, match="not loopback"):
        LISTENERS[listener]("0.0.0.0", None).validate()


def test_the_index_config_never_shows_its_token_or_store() -> None:
    secret = "s3cret-" + "k" * MIN_TOKEN_CHARS
    store = "https://reader:hunter2@clickhouse.example:8443/kv"
    config = IndexConfig(KafkaSettings(bootstrap_servers="b:9092"), token=secret, clickhouse=store)
    assert secret not in repr(config) and "hunter2" not in repr(config)

"""The one switch's endpoint: `kafka://` brokers and settings, `KVSCOPE_*` overrides, refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kvscope.publisher.vllm.switch import engine_config, is_switched_on, parse_endpoint
from kvscope.schemas import ConfigError


@pytest.mark.parametrize(
    ("endpoint", "brokers", "zmq"),
    [
        ("kafka://b:9092", "b:9092", None),
        ("kafka://b1:9092,b2:9093", "b1:9092,b2:9093", None),
        ("kafka://127.0.0.1:1?zmq=tcp://*:5557", "127.0.0.1:1", "tcp://*:5557"),
        ("kafka://h:2?zmq=ipc:///tmp/x/pub&linger_ms=5", "h:2", "ipc:///tmp/x/pub"),
    ],
)
def test_brokers_and_zmq_come_from_the_endpoint(endpoint: str, brokers: str, zmq: str) -> None:
    switch = parse_endpoint(endpoint, environ={})
    assert switch.config.bootstrap_servers == brokers
    assert switch.zmq_endpoint == zmq
    assert switch.config.enabled


def test_settings_are_typed_like_the_environment_and_the_environment_wins() -> None:
    endpoint = "kafka://b:1?linger_ms=5&role=prefill&access_stream=false&topic_prefix=x."
    switch = parse_endpoint(endpoint, environ={})
    assert (switch.config.linger_ms, switch.config.role) == (5.0, "prefill")
    assert (switch.config.access_stream, switch.config.topic_prefix) == (False, "x.")
    env = {"KVSCOPE_LINGER_MS": "700", "KVSCOPE_BOOTSTRAP_SERVERS": "other:2", "KVSCOPE_ROLE": ""}
    overridden = parse_endpoint(endpoint, environ=env).config
    assert (overridden.linger_ms, overridden.bootstrap_servers) == (700.0, "other:2")
    assert overridden.role == "prefill", "an empty variable is unset, as everywhere else"


def test_security_settings_come_through_and_passwords_only_from_the_environment() -> None:
    endpoint = "kafka://b:1?security_protocol=SASL_SSL&sasl_mechanism=PLAIN&sasl_username=u"
    config = parse_endpoint(endpoint, environ={"KVSCOPE_SASL_PASSWORD": "pw"}).config
    assert config.security.sasl_username == "u"
    assert config.security.sasl_password == "pw"
    for secret in ("sasl_password", "ssl_password"):
        with pytest.raises(ConfigError, match=f"set KVSCOPE_{secret.upper()}") as refused:
            parse_endpoint(f"kafka://b:1?{secret}=hunter2", environ={})
        assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("tcp://*:5557", 'needs "endpoint": "kafka://'),
        ("kafka://b:1?lingr_ms=5", "unknown kvscope setting 'lingr_ms'"),
        ("kafka://b:1?linger_ms=soon", "KVSCOPE_LINGER_MS='soon' is not a number"),
        ("kafka://b:1?role=leader", "role 'leader'"),
        ("kafka://", "KVSCOPE_BOOTSTRAP_SERVERS|no brokers"),
        ("kafka://nohostport", "KVSCOPE_BOOTSTRAP_SERVERS"),
    ],
)
def test_a_bad_endpoint_says_what_to_fix(endpoint: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_endpoint(endpoint, environ={})


def _vllm_config(publisher: str, enabled: bool = True, endpoint: str = "") -> SimpleNamespace:
    events = SimpleNamespace(enable_kv_cache_events=enabled, publisher=publisher, endpoint=endpoint)
    return SimpleNamespace(kv_events_config=events)


def test_engine_config_follows_the_switch_else_the_environment() -> None:
    env = {"KVSCOPE_BOOTSTRAP_SERVERS": "env:1"}
    switched = _vllm_config("kvscope", endpoint="kafka://flag:1?stats_interval_s=3")
    assert is_switched_on(switched.kv_events_config)
    config = engine_config(switched, environ={})
    assert (config.bootstrap_servers, config.stats_interval_s) == ("flag:1", 3.0)
    for other in (_vllm_config("zmq"), _vllm_config("kvscope", enabled=False)):
        assert not is_switched_on(other.kv_events_config)
        assert engine_config(other, environ=env).bootstrap_servers == "env:1"
        assert not engine_config(other, environ={}).enabled
    assert engine_config(SimpleNamespace(), environ=env).bootstrap_servers == "env:1"

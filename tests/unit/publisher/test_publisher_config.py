"""PublisherConfig: environment parsing, validation, and secrets kept out of repr."""

from __future__ import annotations

import pytest
from kvscope.common.kafka import SECURITY_FIELDS, KafkaSecurity, host_and_port
from kvscope.publisher import PublisherConfig
from kvscope.publisher.sender import producer_kwargs
from kvscope.schemas import ConfigError


def test_from_env_reads_every_kind_of_field() -> None:
    config = PublisherConfig.from_env(
        {
            "KVSCOPE_BOOTSTRAP_SERVERS": "k1:9092,k2:9093",
            "KVSCOPE_TOPIC_PREFIX": "prod.kv.",
            "KVSCOPE_INSTANCE": "pod-7",
            "KVSCOPE_ROLE": "prefill",
            "KVSCOPE_MODEL": "llama",
            "KVSCOPE_QUEUE_SIZE": "500",
            "KVSCOPE_LINGER_MS": "2.5",
            "KVSCOPE_FORWARD_TOKEN_IDS": "yes",
            "KVSCOPE_COMPRESSION": "zstd",
            "KVSCOPE_SASL_PASSWORD": "s3cret",
            "UNRELATED": "x",
        }
    ).validate()
    assert config.enabled
    assert (config.bootstrap_servers, config.topic_prefix) == ("k1:9092,k2:9093", "prod.kv.")
    assert (config.instance, config.role, config.model) == ("pod-7", "prefill", "llama")
    assert (config.queue_size, config.linger_ms, config.forward_token_ids) == (500, 2.5, True)
    assert config.compression == "zstd"
    assert config.security.sasl_password == "s3cret"


def test_empty_environment_means_off_with_defaults() -> None:
    config = PublisherConfig.from_env({}).validate()
    assert not config.enabled
    assert config.topic_prefix == "kvscope."
    assert config.role == "both"


def test_overrides_win_over_environment() -> None:
    config = PublisherConfig.from_env({"KVSCOPE_ROLE": "decode"}, role="prefill")
    assert config.role == "prefill"


def test_security_fields_come_from_their_variables_and_flat_overrides() -> None:
    env = {"KVSCOPE_SECURITY_PROTOCOL": "SASL_SSL", "KVSCOPE_SASL_USERNAME": "env-user"}
    config = PublisherConfig.from_env(env, sasl_username="flag-user")
    assert config.security == KafkaSecurity(security_protocol="SASL_SSL", sasl_username="flag-user")
    assert set(PublisherConfig.env_variables()) >= {
        "KVSCOPE_" + name.upper() for name in SECURITY_FIELDS
    }
    assert "KVSCOPE_SECURITY" not in PublisherConfig.env_variables()


def config_of(fields: dict[str, object]) -> PublisherConfig:
    """A PublisherConfig from flat fields, the security block's ones going into it."""
    security = {k: v for k, v in fields.items() if k in SECURITY_FIELDS}
    rest = {k: v for k, v in fields.items() if k not in SECURITY_FIELDS}
    return PublisherConfig(security=KafkaSecurity(**security), **rest)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KVSCOPE_QUEUE_SIZE": "many"}, "KVSCOPE_QUEUE_SIZE='many' is not a number"),
        ({"KVSCOPE_FORWARD_TOKEN_IDS": "maybe"}, "use true or false"),
    ],
)
def test_bad_environment_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PublisherConfig.from_env(env)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"bootstrap_servers": "kafka"}, "not host:port"),
        ({"bootstrap_servers": "k:99999"}, "not host:port"),
        ({"topic_prefix": "a b"}, "topic prefix .a b. has . .: use letters"),
        ({"topic_prefix": "p" * 233}, "topic prefix is 233 characters: at most 232"),
        ({"queue_size": 0}, "queue_size must be a finite number > 0"),
        ({"linger_ms": -1}, "linger_ms must be 0..60000"),
        ({"linger_ms": float("nan")}, "linger_ms must be 0..60000"),
        ({"linger_ms": float("inf")}, "linger_ms must be 0..60000"),
        ({"delivery_timeout_s": float("nan")}, "delivery_timeout_s must be a finite number"),
        ({"stats_interval_s": float("inf")}, "stats_interval_s must be a finite number"),
        ({"reconnect_backoff_max_s": float("-inf")}, "reconnect_backoff_max_s"),
        ({"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"}, "not a readable file"),
        ({"ssl_cafile": "/etc/hostname"}, "security_protocol is PLAINTEXT"),
        ({"security_protocol": "TLS"}, "choose one of PLAINTEXT"),
        (
            {"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_mechanism": "GSSAPI"},
            "sasl_mechanism",
        ),
        ({"compression": "snappy"}, "choose one of lz4, zstd, gzip, none"),
        ({"acks": "2"}, "acks"),
        ({"role": "router"}, "role"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_username"),
        ({"ssl_keyfile": "k.pem"}, "needs ssl_certfile"),
        ({"delivery_timeout_s": 0}, "delivery_timeout_s"),
    ],
)
def test_validate_rejects_bad_values(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_of(fields).validate()


def test_secrets_stay_out_of_repr() -> None:
    config = config_of(
        {"sasl_password": "hunter2", "ssl_password": "pem-pass", "sasl_username": "u"}
    )
    assert "hunter2" not in repr(config)
    assert "pem-pass" not in repr(config)
    assert "sasl_username='u'" in repr(config)


def test_security_settings_reach_the_kafka_client() -> None:
    config = PublisherConfig(
        bootstrap_servers="k:9092",
        security=KafkaSecurity(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="svc",
            sasl_password="pw",
        ),
        acks="1",
        compression="none",
    ).validate()
    kwargs = producer_kwargs(config)
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("svc", "pw")
    assert kwargs["acks"] == 1
    assert kwargs["compression_type"] is None
    assert kwargs["enable_idempotence"] is False


def test_plaintext_sends_no_credentials() -> None:
    config = PublisherConfig(bootstrap_servers="k:9092", security=KafkaSecurity(sasl_password="pw"))
    kwargs = producer_kwargs(config)
    assert "sasl_plain_password" not in kwargs
    assert "ssl_context" not in kwargs


@pytest.mark.parametrize(
    ("server", "address"),
    [
        ("k:9092", ("k", 9092)),
        (" k:1 ", ("k", 1)),
        ("[::1]:65535", ("[::1]", 65535)),
        ("k:0", None),
        ("k:65536", None),
        ("k:99999", None),
        ("k:-1", None),
        ("k:", None),
        (":9092", None),
        ("k", None),
        ("k:9092x", None),
    ],
)
def test_host_and_port_takes_ports_1_to_65535(server: str, address: tuple[str, int] | None) -> None:
    assert host_and_port(server) == address
    if address is None:
        with pytest.raises(ConfigError, match="is not host:port"):
            config_of({"bootstrap_servers": f"ok:1,{server}"}).validate()

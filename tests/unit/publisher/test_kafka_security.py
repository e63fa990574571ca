"""The shared Kafka security block: validation, and passthrough to every kvscope client.

The local broker speaks PLAINTEXT only, so SASL/TLS cannot run end to end here: these
tests check that the settings reach aiokafka's clients (which accept and use them).
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kvscope.cli.commands.collect import collector_config, security_flags
from kvscope.cli.main import build_parser, main
from kvscope.common.kafka import KafkaSecurity
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.sender import producer_kwargs
from kvscope.schemas import ConfigError

ENV = {"KVSCOPE_SASL_PASSWORD": "hunter2", "KVSCOPE_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}


def _accepted(client: type, **kwargs: object) -> None:
    """aiokafka builds the client from these arguments (not started: no broker here)."""

    async def build() -> None:
        await client(**kwargs).stop()

    asyncio.run(build())


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real self-signed CA certificate made by openssl."""
    folder = tmp_path_factory.mktemp("ca")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=kvscope-test-ca", "-keyout", str(folder / "ca.key"),
            "-out", str(folder / "ca.pem"),
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return folder / "ca.pem"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security_protocol": "TLS"}, "choose one of"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_username"),
        ({"ssl_keyfile": "k.pem"}, "needs ssl_certfile"),
        ({"security_protocol": "SSL", "ssl_cafile": "/no/such.pem"}, "not a readable file"),
        ({"security_protocol": "SSL", "ssl_cafile": "/"}, "not a readable file"),
        ({"ssl_cafile": "/etc/hostname"}, "security_protocol is PLAINTEXT"),
    ],
)
def test_invalid_blocks_are_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaSecurity(**fields).validate()  # type: ignore[arg-type]


def test_tls_and_sasl_reach_producer_and_consumer(ca_file: Path) -> None:
    block = KafkaSecurity(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="kv",
        sasl_password="hunter2",
        ssl_cafile=str(ca_file),
    ).validate()
    kwargs = block.client_kwargs()
    assert kwargs["sasl_plain_password"] == "hunter2"
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "kvscope-test-ca"),),)
    ]
    assert "hunter2" not in repr(block)
    publisher = PublisherConfig(bootstrap_servers="k:9092", security=block)
    assert producer_kwargs(publisher.validate())["sasl_mechanism"] == "SCRAM-SHA-512"
    _accepted(AIOKafkaProducer, **producer_kwargs(publisher))
    _accepted(AIOKafkaConsumer, bootstrap_servers="k:9092", **kwargs)


def test_collect_flags_over_environment_reach_the_consumer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(
        ["collect", "--clickhouse", f"chdb://{tmp_path}", "--sasl-username", "collector"]
    )
    config = collector_config(args)
    assert config.kafka is not None
    kwargs = config.kafka.security_kwargs()
    assert kwargs == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "collector",
        "sasl_plain_password": "hunter2",
    }
    _accepted(AIOKafkaConsumer, bootstrap_servers=config.bootstrap_servers, **kwargs)


def test_bridge_flags_reach_the_publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_SASL_PASSWORD", "hunter2")
    args = build_parser().parse_args(
        [
            "bridge", "--bootstrap-servers", "k:9092", "--zmq", "tcp://e:1",
            "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "bridge",
        ]
    )  # fmt: skip
    config = PublisherConfig.from_env(bootstrap_servers="k:9092", **security_flags(args))
    kwargs = producer_kwargs(config.validate())
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("bridge", "hunter2")


@pytest.mark.parametrize("command", ["collect", "bridge"])
def test_a_missing_cafile_is_a_one_line_error(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [command, "--bootstrap-servers", "k:9092", "--security-protocol", "SSL"]
    argv += ["--ssl-cafile", str(tmp_path / "missing.pem")]
    argv += (
        ["--clickhouse", f"chdb://{tmp_path}"] if command == "collect" else ["--zmq", "tcp://e:1"]
    )
    assert main(argv) == 2  # bad input
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ssl_cafile" in err and "not a readable file" in err

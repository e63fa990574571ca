"""The collector and the bridge read Kafka security from the publisher's KVSCOPE_* variables
(the Kubernetes manifests wire SASL_SSL that way)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys

import pytest
from kvscope.cli.commands.collect import collector_config
from kvscope.cli.main import build_parser

SASL = {
    "KVSCOPE_SECURITY_PROTOCOL": "SASL_SSL",
    "KVSCOPE_SASL_MECHANISM": "SCRAM-SHA-512",
    "KVSCOPE_SASL_USERNAME": "collector",
    "KVSCOPE_SASL_PASSWORD": "s3cret",
}


def _collect_args(*extra: str) -> object:
    return build_parser().parse_args(
        ["collect", "--bootstrap-servers=k1:9093,k2:9093", "--clickhouse=chdb:///tmp/x", *extra]
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"security_protocol": "PLAINTEXT"}),
        (
            SASL,
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "collector",
                "sasl_plain_password": "s3cret",
            },
        ),
        (
            {"KVSCOPE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KVSCOPE_SASL_USERNAME": "u"},
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "u",
                "sasl_plain_password": "",
            },
        ),
    ],
    ids=["plaintext", "sasl-ssl", "sasl-plaintext"],
)
def test_collect_reads_kafka_security_from_the_environment(
    env: dict[str, str], expected: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("KVSCOPE_") and name != "KVSCOPE_CLICKHOUSE_URL":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = collector_config(_collect_args())
    assert config.kafka is not None
    assert config.kafka.bootstrap_servers == "k1:9093,k2:9093"
    kwargs = config.kafka.security_kwargs()
    ssl_context = kwargs.pop("ssl_context", None)
    assert kwargs == expected
    assert isinstance(ssl_context, ssl.SSLContext) == expected["security_protocol"].endswith("SSL")
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize("command", ["collect", "bridge"])
def test_sasl_without_a_user_is_a_one_line_configuration_error(command: str) -> None:
    env = {**os.environ, "KVSCOPE_SECURITY_PROTOCOL": "SASL_SSL"}
    env.pop("KVSCOPE_SASL_USERNAME", None)
    args = {
        "collect": ["collect", "--clickhouse=chdb:///tmp/kvscope-unused"],
        "bridge": ["bridge", "--zmq=ipc:///tmp/kvscope-unused"],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args, "--bootstrap-servers=k:9093"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr  # bad input: exit 2
    assert done.stderr.count("\n") == 1 and "needs sasl_username" in done.stderr

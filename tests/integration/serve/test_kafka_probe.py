"""`check_kafka` tells a Kafka broker from another service before a command starts.

The broker is the real local one. The other services are small TCP listeners written
here, since no real service is needed to show a port that accepts and then answers
wrongly or not at all; the one that answers with a foreign correlation id is a fake
Kafka reply, made to inject a fault a real broker does not produce.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kvscope.collector.errors import BrokerError
from kvscope.serve import kafka_probe
from kvscope.serve.access import check_kafka

Reply = Callable[[socket.socket], None]


@contextlib.contextmanager
def listener(reply: Reply) -> Iterator[str]:
    """host:port of a loopback listener that handles each connection with `reply`."""
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.1)

        def serve() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn, _ = server.accept()
                    with conn:
                        reply(conn)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield f"127.0.0.1:{server.getsockname()[1]}"
        finally:
            stop.set()
            thread.join()


def _silent(conn: socket.socket) -> None:
    conn.recv(1024)
    time.sleep(1.5)


def _closes(conn: socket.socket) -> None:
    conn.recv(1024)


def _http(conn: socket.socket) -> None:
    conn.recv(1024)
    conn.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def _ssh_banner(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
    conn.recv(1024)


def _reply_with_id(correlation_id: int, payload: bytes) -> Reply:
    def reply(conn: socket.socket) -> None:
        conn.recv(1024)
        frame = struct.pack(">i", correlation_id) + payload
        conn.sendall(struct.pack(">i", len(frame)) + frame)

    return reply


# An ApiVersions v0 response body: error_code 0, one range (api 18, versions 0..3).
_API_VERSIONS_BODY = struct.pack(">hihhh", 0, 1, 18, 0, 3)


def test_the_local_broker_answers_the_probe(bootstrap_servers: str) -> None:
    host, port = bootstrap_servers.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        assert kafka_probe.problem(conn, 5.0) is None
    check_kafka(bootstrap_servers)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (_silent, "no Kafka response within 0.5 s"),
        (_closes, "it closed the connection without a Kafka response"),
        (_http, "its reply is not a Kafka response"),
        (_ssh_banner, "its reply is not a Kafka response"),
        (_reply_with_id(7, _API_VERSIONS_BODY), "its reply is not a Kafka response"),
        (_reply_with_id(kafka_probe.CORRELATION_ID, b"\x00"), "its reply is not a Kafka response"),
        (
            _reply_with_id(kafka_probe.CORRELATION_ID, struct.pack(">hi", 31, 0)),
            "Kafka error code 31",
        ),
    ],
    ids=["silent", "closes", "http", "ssh", "foreign-id", "short-body", "error-code"],
)
def test_a_port_of_another_service_is_named_in_one_error(reply: Reply, reason: str) -> None:
    with listener(reply) as address:
        started = time.monotonic()
        with pytest.raises(BrokerError) as caught:
            check_kafka(address, timeout_s=0.5)
        waited = time.monotonic() - started
    assert str(caught.value) == (
        f"Kafka at {address} did not answer as a Kafka broker ({address}: {reason}): "
        "check --bootstrap-servers and the security settings"
    )
    assert waited < 5, "the probe waited past its timeout"


def test_a_broker_that_has_dropped_version_0_still_passes() -> None:
    """It answers UNSUPPORTED_VERSION (35) in the v0 form, with the versions it has."""
    body = struct.pack(">hihhh", 35, 1, 18, 3, 4)
    with listener(_reply_with_id(kafka_probe.CORRELATION_ID, body)) as address:
        check_kafka(address, timeout_s=0.5)


def test_one_broker_among_the_servers_is_enough(bootstrap_servers: str) -> None:
    with listener(_http) as other:
        check_kafka(f"{other},{bootstrap_servers}", timeout_s=0.5)


def test_every_server_is_named_when_none_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        refused = f"127.0.0.1:{closed.getsockname()[1]}"
    with (
        listener(_http) as other,
        pytest.raises(BrokerError, match="did not answer as a Kafka broker") as caught,
    ):
        check_kafka(f"{refused},{other}", timeout_s=0.5)
    assert f"{other}: its reply is not a Kafka response" in str(caught.value)
    assert f"{refused}: Connection refused" in str(caught.value)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_a_tls_listener_is_only_connected_to(protocol: str) -> None:
    """A TLS port would take the plaintext probe as a broken handshake: not sent there."""
    with listener(_silent) as address:
        check_kafka(address, protocol, timeout_s=0.5)


def test_without_the_probe_a_connection_is_enough() -> None:
    """`simulate` plays engines, which publish to a broker that does not answer."""
    with listener(_silent) as address:
        check_kafka(address, timeout_s=0.5, probe=False)

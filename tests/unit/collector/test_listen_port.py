"""`listen_port`: a port a server can bind later, out of the way of outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from kvscope.local import broker


def test_listen_ports_are_free_and_below_the_ephemeral_range() -> None:
    first_ephemeral = int(broker.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {broker.listen_port() for _ in range(20)}
    assert len(ports) > 1
    for port in ports:
        assert broker.LOWEST_LISTEN_PORT <= port < first_ephemeral
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("content", ["", "not a range", "1024\t60999"])
def test_an_unknown_or_low_range_falls_back_to_a_free_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    """A fake range file (the kernel's cannot be set on demand) with nothing usable in it."""
    fake = tmp_path / "ip_local_port_range"
    fake.write_text(content)
    monkeypatch.setattr(broker, "EPHEMERAL_RANGE", fake)
    port = broker.listen_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))

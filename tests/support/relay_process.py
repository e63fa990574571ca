"""`kvscope relay` as a real subprocess for tests: the publisher's relay tests and the
real engine's one-switch test start, kill and stop it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support.e2e_support import wait_for


class RelayProcess:
    """`kvscope relay` as a subprocess on an ipc:// socket in `folder`, started, killed and
    restarted; `flags` go on its command line after the socket and the brokers."""

    def __init__(self, folder: Path, bootstrap_servers: str, flags: tuple[str, ...]) -> None:
        self.listen = f"ipc://{folder}/relay.sock"
        self._log = folder / "relay.log"
        self._bootstrap = bootstrap_servers
        self._flags = flags
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        """Start it and wait until it listens."""
        self._log.write_text("")
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "kvscope.cli", "relay", "--log-level", "INFO"),
                    *("--listen", self.listen, "--bootstrap-servers", self._bootstrap),
                    *self._flags,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: "listening on" in self._log.read_text(), timeout_s=90)
        return self

    def kill(self) -> None:
        """SIGKILL: whatever it held is gone without an ack."""
        assert self._process is not None
        self._process.kill()
        self._process.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait; its exit code (None if it was not running)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"relay did not stop: {self._log.read_text()[-2000:]}") from None

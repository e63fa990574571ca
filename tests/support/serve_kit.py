"""Run `kvscope serve` (and other `kvscope` commands) as subprocesses, as a user runs them.

`ServeProcess` starts a serve on a free port with its own chDB directory, topic prefix and
consumer group, waits for the record it leaves in the directory, and stops it with SIGTERM
(its output is shown when it fails). `publish_fleet` sends a small simulated fleet through
the real Kafka publisher and returns how many envelopes of each stream were sent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from kvscope.serve.state import read_state

KVSCOPE = [sys.executable, "-m", "kvscope.cli"]


def kvscope(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Any:
    """Run one `kvscope` command to completion; the CompletedProcess (text)."""
    return subprocess.run(
        [*KVSCOPE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def terminate(process: subprocess.Popen[bytes] | None) -> int:
    """SIGTERM `process`, wait (kill after 30 s); its exit code (0 if never started)."""
    if process is None:
        return 0
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


class ServeProcess:
    """A `kvscope serve` subprocess on `chdb_dir`; use as a context manager."""

    def __init__(
        self,
        bootstrap_servers: str,
        chdb_dir: Path,
        topic_prefix: str,
        *extra: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.chdb_dir = chdb_dir
        self.clickhouse = f"chdb://{chdb_dir}"
        self.args = [
            "serve",
            "--bootstrap-servers",
            bootstrap_servers,
            "--clickhouse",
            self.clickhouse,
            "--topic-prefix",
            topic_prefix,
            "--group",
            f"g-{topic_prefix}",
            "--port",
            "0",
            "--batch-seconds",
            "0.2",
            *extra,
        ]
        self._log = chdb_dir.parent / f"serve-{topic_prefix}log"
        self._env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token: str | None = None

    def start(self, timeout_s: float = 60) -> ServeProcess:
        """Start and wait until the serve recorded its URL and answers /healthz."""
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(
                [*KVSCOPE, *self.args], stdout=log, stderr=subprocess.STDOUT, env=self._env
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"kvscope serve exited early:\n{self.output()}")
            state = read_state(self.chdb_dir)
            if state is not None and state.pid == self.process.pid:
                self.url, self.token = state.url, state.token
                return self
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"kvscope serve did not become ready:\n{self.output()}")

    def wait_assigned(self, stream: str, timeout_s: float = 60) -> None:
        """Wait until the collector was assigned partitions of `stream`'s topic (its log says so).

        The local broker creates a topic when a client first asks for it; a subscribed topic
        nobody publishes to (engine-histograms, here) appears a little later and moves the
        group through one more rebalance. Tests measuring freshness wait for that first.
        """
        needle = f"assigned {self.args[self.args.index('--topic-prefix') + 1]}{stream}["
        deadline = time.monotonic() + timeout_s
        while needle not in self.output():
            if time.monotonic() > deadline:
                raise AssertionError(f"no partitions of {stream} assigned:\n{self.output()}")
            time.sleep(0.1)

    def output(self) -> str:
        """Everything the serve printed so far."""
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        """GET `path` (status, body), with `token` (default: the serve's) as bearer."""
        request = urllib.request.Request(self.url + path)
        token = self.token if token is None else token
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get_json(self, path: str) -> Any:
        """GET `path`, assert 200, parse the JSON."""
        status, body = self.get(path)
        assert status == 200, f"{path}: {status} {body[:300]!r}"
        return json.loads(body)

    def stop(self) -> int:
        """SIGTERM, wait (kill after 30 s); the exit code."""
        return terminate(self.process)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def publish_fleet(
    bootstrap_servers: str,
    topic_prefix: str,
    *,
    requests: int = 40,
    instances: str = "1p,1d",
    seed: int = 1,
    start_ts: float | None = None,
) -> Counter[str]:
    """Publish a small simulated fleet through Kafka; envelopes sent per stream name."""
    from kvscope.schemas.streams import stream_of
    from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
    from kvscope.simulator.sinks import KafkaSink

    config = SimConfig(
        instances=parse_instances(instances),
        requests=requests,
        rate=4.0,
        seed=seed,
        capacity_blocks=64,
        start_ts=start_ts if start_ts is not None else time.time() - requests / 4.0 - 1,
    )
    sink = KafkaSink(bootstrap_servers, topic_prefix)
    sent: Counter[str] = Counter()

    def publish(source: Any, epoch: int, body: Any, ts: float) -> None:
        sent[stream_of(body)] += 1
        sink(source, epoch, body, ts)

    try:
        Fleet(config, publish).run()
        assert sink.kafka.flush(30), "the broker did not acknowledge the simulated records"
    finally:
        sink.close(2.0)
    return sent

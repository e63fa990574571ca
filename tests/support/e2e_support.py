"""Helpers shared by the end-to-end tests (bridge and vLLM plugin): the ground truth, the
collector run, and a real vLLM API server's command (its health wait is
`kvscope.local.processes.wait_healthy`).

The ground truth is a plain ZMQ subscriber that records every frame an engine published,
decoded here without kvscope's code; the other side is what kvscope sent to Kafka, stored
in ClickHouse by the real collector.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target

from support.collector_testkit import SESSION_TIMEOUT_MS


class DirectSubscriber:
    """A plain ZMQ subscriber that keeps every `[topic, seq, payload]` frame's payload by seq."""

    def __init__(self, endpoint: str) -> None:
        self.frames: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(50):
                _topic, seq, payload = self._sock.recv_multipart()
                assert len(seq) == 8, f"seq frame of {len(seq)} bytes"
                self.frames[int.from_bytes(seq, "big")] = payload

    def close(self) -> None:
        """Stop receiving and close the socket."""
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, what: str = "") -> None:
    """Poll `condition` until it holds; fail the test after `timeout_s`, naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s: {what or condition}"
        time.sleep(0.02)


def collect(clickhouse: Any, clickhouse_url: str, bootstrap_servers: str, topic_prefix: str) -> int:
    """Run the real collector over the test's topics until idle for 2 s.

    Returns the kv_block_events row count.
    """
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = CollectorConfig(
        bootstrap_servers=bootstrap_servers,
        target=target,
        group=f"g-{topic_prefix}",
        topic_prefix=topic_prefix,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        batch_seconds=0.3,
        exit_when_idle=2.0,
    )
    asyncio.run(Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse))).run())
    return clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0]


def api_server_command(
    model_dir: Path, port: int, served_model: str, kv_events: dict[str, Any], *extra: str
) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs) for the tiny
    model on loopback: eager, prefix caching, 12 blocks of 32 tokens, KV events on, and a
    shutdown timeout so SIGTERM/SIGINT lets kvscope deliver its queue (docs/publisher.md)."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", served_model, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--block-size", "32", "--enable-prefix-caching",
        "--enforce-eager", "--max-model-len", "256", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "256", "--num-gpu-blocks-override", "12",
        "--shutdown-timeout", "20", "--kv-events-config", json.dumps(kv_events), *extra,
    ]  # fmt: skip

"""Bridge test helpers: a direct ZMQ subscriber (the ground truth), `wait_for`, `collect`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from kvscope.collector.config import CollectorConfig
from kvscope.collector.migrate import migrate
from kvscope.collector.service import Collector
from kvscope.collector.target import parse_target
from kvscope.collector.write import ClickHouseSink
from kvscope.publisher.zmq_frames import parse_live


class DirectSubscriber:
    """A plain ZMQ subscriber that records every frame it sees (the ground truth)."""

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
                frame = parse_live(self._sock.recv_multipart())
                self.frames[frame.seq] = frame.payload

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll `condition` until it holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def collect(bootstrap_servers: str, topic_prefix: str, clickhouse: Any, url: str) -> int:
    """Run the collector until idle; return the kv_block_events row count."""
    target = parse_target(url)
    migrate(clickhouse, target)
    config = CollectorConfig(
        bootstrap_servers=bootstrap_servers,
        target=target,
        group=f"g-{topic_prefix}",
        topic_prefix=topic_prefix,
        session_timeout_ms=3000,
        batch_seconds=0.3,
        exit_when_idle=2.0,
    )
    asyncio.run(Collector(config, sink=ClickHouseSink(clickhouse)).run())
    return clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0]

"""Helpers of the real-vLLM end-to-end tests: ZMQ ground truth, the collector run, checks.

The ground truth is what vLLM itself published on ZMQ (captured by a plain subscriber
connected before any request) and vLLM's own counters; the other side is what kvscope's
plugin sent to Kafka, stored in ClickHouse by the real collector.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zmq
from kvscope.collector.config import CollectorConfig
from kvscope.collector.migrate import migrate
from kvscope.collector.service import Collector
from kvscope.collector.target import parse_target
from kvscope.collector.write import ClickHouseSink
from kvscope.schemas import AllBlocksCleared, BlockStored, decode_engine_payload


class ZmqCapture:
    """Subscribes to vLLM's KV-event PUB socket and keeps every payload by its seq."""

    def __init__(self, endpoint: str) -> None:
        self.payloads: dict[int, bytes] = {}
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while self._running:
            if not self._socket.poll(50):
                continue
            _topic, seq, payload = self._socket.recv_multipart()
            self.payloads[int.from_bytes(seq, "big")] = payload

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self._socket.close(linger=0)

    def block_rows(self) -> list[tuple[str, int]]:
        """(event, block hash) in publication order, as kv_block_events stores them."""
        return self.rows_of(self.payloads)

    @staticmethod
    def rows_of(payloads: dict[int, bytes], first_seq: int = 0) -> list[tuple[str, int]]:
        """The block rows of the payloads with seq >= first_seq."""
        rows: list[tuple[str, int]] = []
        for seq in sorted(s for s in payloads if s >= first_seq):
            for event in decode_engine_payload(payloads[seq], "vllm").events:
                if isinstance(event, AllBlocksCleared):
                    rows.append(("cleared", 0))
                else:
                    kind = "stored" if isinstance(event, BlockStored) else "removed"
                    rows.extend((kind, h) for h in event.block_hashes)
        return rows


def start_engine_proc(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start `plugin_engine_proc.py` with `args`; its stdout (and vLLM's logs) is readable."""
    script = Path(__file__).with_name("plugin_engine_proc.py")
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def capture_then_go(engine: subprocess.Popen[str], pub_url: str, go: Path) -> ZmqCapture:
    """Once the engine is ready, subscribe to its ZMQ events, then let it run the workload."""
    read_until(engine, "ready")
    capture = ZmqCapture(pub_url)
    time.sleep(0.3)  # the subscription reaches the PUB socket before the first batch
    go.touch()
    return capture


def stop(capture: ZmqCapture | None, process: subprocess.Popen[Any]) -> None:
    """Close the subscriber and make sure the vLLM process is gone (test cleanup)."""
    if capture is not None:
        capture.close()
    process.kill()
    process.wait()


def read_until(process: subprocess.Popen[str], prefix: str) -> str:
    """Read the process's stdout until a line starts with `prefix`; return that line."""
    assert process.stdout is not None
    tail: list[str] = []
    for line in process.stdout:
        if line.startswith(prefix):
            return line
        tail = [*tail[-60:], line]
    raise AssertionError(f"process ended before printing {prefix!r}:\n{''.join(tail)}")


def collect(clickhouse: Any, clickhouse_url: str, bootstrap_servers: str, prefix: str) -> None:
    """Run the real collector over the test's topics until it has been idle for 2 s."""
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = CollectorConfig(
        bootstrap_servers=bootstrap_servers,
        target=target,
        group=f"g-{prefix}",
        topic_prefix=prefix,
        session_timeout_ms=3000,
        batch_seconds=0.3,
        exit_when_idle=2.0,
    )
    asyncio.run(Collector(config, sink=ClickHouseSink(clickhouse)).run())


def assert_same_blocks_as_zmq(clickhouse: Any, capture: ZmqCapture) -> None:
    """kv_block_events holds exactly the hashes vLLM published on ZMQ, in order, all kinds."""
    zmq_rows = capture.block_rows()
    assert {kind for kind, _ in zmq_rows} == {"stored", "removed", "cleared"}
    assert sorted(capture.payloads) == list(range(len(capture.payloads)))
    assert stored_block_rows(clickhouse) == zmq_rows


def stored_block_rows(clickhouse: Any) -> list[tuple[str, int]]:
    """kv_block_events as (event, block hash) in publication order."""
    rows = clickhouse.query(
        "SELECT toString(event), block_hash FROM kv_block_events"
        " ORDER BY seq, event_index, position"
    ).result_rows
    return [(kind, block_hash) for kind, block_hash in rows]


def distinct(clickhouse: Any, table: str, columns: str) -> list[tuple[Any, ...]]:
    """DISTINCT `columns` of `table`, sorted (tables and columns are test constants)."""
    rows = clickhouse.query(f"SELECT DISTINCT {columns} FROM {table} ORDER BY ALL").result_rows
    return [tuple(row) for row in rows]

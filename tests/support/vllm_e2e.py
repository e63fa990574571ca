"""Helpers of the real-vLLM end-to-end tests: the engine process, ZMQ ground truth, checks.

The ground truth is what vLLM itself published on ZMQ (captured by a plain subscriber
connected before any request) and vLLM's own counters; the other side is what kvscope's
plugin sent to Kafka, stored in ClickHouse by the real collector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.e2e_support import DirectSubscriber
from support.engine_truth import vllm_events


class ZmqCapture(DirectSubscriber):
    """Subscribes to vLLM's KV-event PUB socket; reads its frames as kv_block_events rows.

    Frames are decoded with vLLM's own structs (`support.engine_truth`), not kvscope's.
    """

    def block_rows(self) -> list[tuple[str, int]]:
        """(event, block hash) in publication order, as kv_block_events stores them."""
        return self.rows_of(self.frames)

    @staticmethod
    def rows_of(frames: dict[int, bytes], first_seq: int = 0) -> list[tuple[str, int]]:
        """The block rows of the frames with seq >= first_seq."""
        rows: list[tuple[str, int]] = []
        for seq in sorted(s for s in frames if s >= first_seq):
            for event in vllm_events(frames[seq]):
                rows.extend((event.kind, h) for h in event.hashes or (0,))
        return rows


def plugin_env(
    bootstrap_servers: str, topic_prefix: str, instance: str = "", **settings: str
) -> dict[str, str]:
    """This process's environment plus kvscope's plugin settings for an engine: the broker,
    the topic prefix, the instance name (when given) and any `KVSCOPE_<NAME>` setting
    passed as `name=value` (`stats_interval_s="0.5"`)."""
    env = {
        **os.environ,
        "KVSCOPE_BOOTSTRAP_SERVERS": bootstrap_servers,
        "KVSCOPE_TOPIC_PREFIX": topic_prefix,
    }
    if instance:
        env["KVSCOPE_INSTANCE"] = instance
    env.update({f"KVSCOPE_{name.upper()}": value for name, value in settings.items()})
    return env


def start_engine_proc(
    args: list[str], env: dict[str, str], script: str = "plugin_engine_proc.py"
) -> subprocess.Popen[str]:
    """Start `script` (an engine script in support/) with `args`; its stdout (and vLLM's
    logs) is readable."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name(script)), *args],
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


def run_engine(
    model: Path,
    workdir: Path,
    env: dict[str, str],
    *args: str,
    script: str = "plugin_engine_proc.py",
) -> tuple[ZmqCapture, dict]:
    """An engine script (`MODEL PUB_URL GO_FILE *args`) through its workload, its ZMQ events
    captured from the start: (what vLLM published on ZMQ, the `truth` line's JSON). The
    process must exit cleanly."""
    pub_url = f"ipc://{workdir}/pub"
    go = workdir / "go"
    engine = start_engine_proc([str(model), pub_url, str(go), *args], env, script)
    capture = None
    try:
        capture = capture_then_go(engine, pub_url, go)
        truth = json.loads(read_until(engine, "truth ").split(" ", 1)[1])
        assert engine.wait(timeout=60) == 0, "kvscope's flush at exit must not fail the engine"
    finally:
        stop(capture, engine)
    return capture, truth


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


def assert_same_blocks_as_zmq(clickhouse: Any, capture: ZmqCapture) -> None:
    """kv_block_events holds exactly the hashes vLLM published on ZMQ, in order, all kinds."""
    zmq_rows = capture.block_rows()
    assert {kind for kind, _ in zmq_rows} == {"stored", "removed", "cleared"}
    assert sorted(capture.frames) == list(range(len(capture.frames)))
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


def zipf_trace(path: Path, requests: int, rate: float, seed: int = 3) -> Path:
    """A generated Mooncake-format trace, one id per 32-token block: questions about 30
    documents of 4 blocks picked by Zipf popularity, 8 output tokens each."""
    from kvscope.simulator.trace import write_trace
    from kvscope.simulator.workloads import generate

    knobs = {"documents": 30, "doc_len": 128, "question_len": 40, "output_len": 8}
    write_trace(path, generate("zipf", requests, seed, rate, knobs), block_tokens=32)
    return path


def run_trace_engine(
    model: Path, trace: Path, workdir: Path, env: dict[str, str], blocks: int, part: str = "0/1"
) -> subprocess.Popen[str]:
    """Start `trace_engine_proc.py` on `trace` with `blocks` KV blocks (see its docstring);
    `trace_truth` reads its result."""
    script = Path(__file__).with_name("trace_engine_proc.py")
    args = [str(model), str(trace), str(workdir), str(blocks), part]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def trace_truth(engine: subprocess.Popen[str]) -> dict:
    """The `truth` line of a `trace_engine_proc.py` run; the process must exit cleanly."""
    try:
        truth = json.loads(read_until(engine, "truth ").split(" ", 1)[1])
        assert engine.wait(timeout=120) == 0, "kvscope's flush at exit must not fail the engine"
    finally:
        stop(None, engine)
    return truth

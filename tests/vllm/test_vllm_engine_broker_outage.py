"""A real vLLM engine whose Kafka broker is down when it starts: nothing reaches vLLM.

kvscope is switched on as docs/publisher.md deploys it, by the one switch
(`--kv-events-config` with `publisher: kvscope`, its settings in the endpoint, vLLM's ZMQ
publisher kept beside it); the environment-variable path is the other engine tests'.

The engine runs three requests while no broker answers (kvscope's delivery timeout is
1 s, so those records are dropped), then the test starts the broker and the engine runs
two more. Every request completes, the engine exits cleanly, and what kvscope could not
deliver is named exactly by `Gap` records, which the collector stores in `stream_gaps`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kvscope.local.broker import LocalBroker, free_port
from support.e2e_support import collect
from support.vllm_e2e import (
    ZmqCapture,
    capture_then_go,
    plugin_env,
    read_until,
    start_engine_proc,
    stop,
    stored_block_rows,
)


@pytest.mark.vllm
def test_engine_runs_through_a_broker_outage_and_gaps_name_the_loss(
    tiny_llama: Path,
    tmp_path: Path,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    broker = LocalBroker(port=free_port())
    pub_url = f"ipc://{tmp_path}/pub"
    go = tmp_path / "go"
    env = plugin_env(
        broker.bootstrap_servers,
        topic_prefix,
        "pod-b:8000",
        stats_interval_s="0.2",
        delivery_timeout_s="1",
        reconnect_backoff_max_s="0.3",
    )
    engine = start_engine_proc([str(tiny_llama), pub_url, str(go), "outage", "switch"], env)
    capture = None
    try:
        capture = capture_then_go(engine, pub_url, go)
        read_until(engine, "phase1")
        lost_batches = len(capture.frames)
        time.sleep(1.5)  # past kvscope's delivery timeout: the queued records are dropped
        broker.start()
        Path(f"{go}.2").touch()
        truth = json.loads(read_until(engine, "truth ").split(" ", 1)[1])
        assert engine.wait(timeout=60) == 0, "the outage must not reach vLLM"
        collect(clickhouse, clickhouse_url, broker.bootstrap_servers, topic_prefix)
    finally:
        stop(capture, engine)
        broker.stop()

    assert sorted(truth["requests"]) == ["a0", "a1", "a2", "b0", "b1"]
    assert lost_batches > 0
    delivered = ZmqCapture.rows_of(capture.frames, first_seq=lost_batches)
    assert stored_block_rows(clickhouse) == delivered
    assert delivered

    gaps = clickhouse.query(
        "SELECT stream, first_seq, last_seq, reason FROM stream_gaps"
        " WHERE detected_by = 'publisher' ORDER BY stream, first_seq"
    ).result_rows
    kv_gaps = [(first, last) for stream, first, last, _ in gaps if stream == "kv-events"]
    assert kv_gaps == [(0, lost_batches - 1)]
    assert {reason for *_, reason in gaps} == {"broker_unavailable"}
    requests = clickhouse.query("SELECT request_id FROM requests ORDER BY 1").result_rows
    assert [r[0] for r in requests] == ["b0", "b1"]
    assert any(stream == "requests" for stream, *_ in gaps)
    accesses = clickhouse.query("SELECT request_id FROM kv_accesses ORDER BY 1").result_rows
    assert [r[0] for r in accesses] == ["b0", "b1"], "the access stream loses only the outage"
    assert [(f, last) for s, f, last, _ in gaps if s == "kv-accesses"] == [(0, 2)]

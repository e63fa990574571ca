"""A real vLLM engine (no kvscope plugin) -> ZMQ -> kvscope bridge -> Kafka, exactly.

The engine runs in a subprocess (like an unmodified engine pod); a direct ZMQ subscriber
connected before any request records the ground truth. The bridge starts late on
purpose (after the engine's first batches), so its first records come from vLLM's
replay socket.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from bridge_zmq_truth import DirectSubscriber, wait_for
from kvscope.consumer import read_envelopes
from kvscope.publisher.bridge import Bridge, BridgeConfig, Endpoint
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import Gap, KVEventBatch, decode_engine_payload

pytest.importorskip("vllm")
ENGINE = Path(__file__).with_name("vllm_engine_proc.py")


def wait_for_line(engine: subprocess.Popen[str], marker: str) -> None:
    """Read the engine's stdout until it prints `marker` (vLLM logs there too)."""
    assert engine.stdout is not None
    tail: list[str] = []
    for line in engine.stdout:
        if line.strip() == marker:
            return
        tail = [*tail[-40:], line]
    raise AssertionError(f"engine exited before {marker!r}:\n{''.join(tail)}")


@pytest.mark.vllm
def test_real_vllm_through_the_bridge_equals_a_direct_subscriber(
    tiny_llama: Path, tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    pub_url, replay_url = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    go = tmp_path / "go"
    engine = subprocess.Popen(
        [
            sys.executable,
            str(ENGINE),
            str(tiny_llama),
            pub_url,
            replay_url,
            "kv@10.1.2.3:8000@tiny-llama",
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    truth = DirectSubscriber(pub_url)
    bridge = None
    try:
        wait_for_line(engine, "ready")
        time.sleep(0.3)
        go.touch()
        wait_for(lambda: len(truth.frames) >= 3, timeout_s=60)
        config = BridgeConfig(engine="vllm", endpoints=[Endpoint(zmq=pub_url, replay=replay_url)])
        bridge = Bridge(config, kafka.for_source, kafka.flush).start()
        wait_for_line(engine, "done")
        wait_for(lambda: bridge.state.get(pub_url) == max(truth.frames) + 1, timeout_s=30)
    finally:
        if bridge is not None:
            bridge.stop()
        truth.close()
        engine.kill()
        engine.wait()
    assert kafka.shutdown(10)

    records = read_envelopes(bootstrap_servers, ["kv-events"], topic_prefix=topic_prefix)
    envelopes = sorted((r.envelope for r in records), key=lambda e: e.seq)
    assert not [e for e in envelopes if isinstance(e.body, Gap)]
    assert {(e.source.instance, e.source.model, e.source.engine) for e in envelopes} == {
        ("10.1.2.3:8000", "tiny-llama", "vllm")
    }
    assert [e.seq for e in envelopes] == list(range(len(truth.frames)))
    expected = [decode_engine_payload(truth.frames[s], "vllm") for s in sorted(truth.frames)]
    assert [e.body for e in envelopes] == expected
    assert sorted(truth.frames) == list(range(len(truth.frames)))
    kinds = {type(ev).__name__ for b in expected if isinstance(b, KVEventBatch) for ev in b.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}

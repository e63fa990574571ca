"""The bridge against SGLang's own ZMQ publisher code (vendored from the sglang wheel, no GPU).

`tests/data/sglang/kv_events.py` is SGLang's `sglang/srt/disaggregation/kv_events.py`
from the sglang 0.5.23 wheel, unmodified (its sha256 is checked here; provenance and the
Apache-2.0 license are next to it). It is loaded with msgspec, pyzmq and pydantic. The
module imports two sglang helpers used only by its discovery functions (`get_parallel`,
`NetworkAddress`); they are stubbed out, which is the one fake here: the publisher, its
structs, PUB socket and replay ring are SGLang's. The truth is the frames a plain
subscriber received, decoded with SGLang's own structs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvscope.consumer import read_envelopes
from kvscope.publisher.bridge.loop import Bridge, BridgeConfig, Endpoint
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import BlockRemoved, BlockStored, Gap, KVEventBatch
from support.e2e_support import DirectSubscriber, wait_for
from support.engine_truth import kvscope_batch, sglang_batch

VENDORED = Path(__file__).parents[2] / "data" / "sglang" / "kv_events.py"
VENDORED_SHA256 = "ef80e7165b11280d30bc07a9e3c04de5057ee45e9c94503a3ac432b009a0e421"
"""sha256 of kv_events.py in sglang-0.5.23 (see tests/data/sglang/README.md)."""


@pytest.fixture(scope="module")
def sglang_kv_events() -> Iterator[types.ModuleType]:
    """SGLang's kv_events module, loaded from the vendored copy after checking its hash."""
    assert hashlib.sha256(VENDORED.read_bytes()).hexdigest() == VENDORED_SHA256
    stubs = {
        "sglang.srt.runtime_context": types.SimpleNamespace(get_parallel=None),
        "sglang.srt.utils.network": types.SimpleNamespace(NetworkAddress=None),
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)  # type: ignore[arg-type]
    try:
        spec = importlib.util.spec_from_file_location("sglang_kv_events", VENDORED)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    yield module


def engine_batch(m: types.ModuleType, i: int) -> object:
    """A batch like SGLang's radix cache emits: CPU_PINNED / DISK mediums, signed hashes."""
    stored = m.BlockStored(
        block_hashes=[-(i + 1), (1 << 62) + i],
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium=m.StorageMedium.CPU.value,
    )
    removed = m.BlockRemoved(block_hashes=[-(i + 1)], medium=m.StorageMedium.DISK.value)
    return m.KVEventBatch(ts=1_700_000_000.0 + i, events=[stored, removed])


def test_sglang_publisher_through_the_bridge(
    sglang_kv_events: types.ModuleType, tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    m = sglang_kv_events
    pub_url, replay_url = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    engine = m.ZmqEventPublisher(
        attn_dp_rank=0, endpoint=pub_url, replay_endpoint=replay_url, buffer_steps=5
    )
    truth = DirectSubscriber(pub_url)
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    time.sleep(0.3)
    bridge = None
    try:
        for i in range(10):  # before the bridge: the ring (5) holds 5..9 when it starts
            engine.publish(engine_batch(m, i))
        wait_for(lambda: 9 in truth.frames)
        config = BridgeConfig(
            engine="sglang",
            endpoints=[Endpoint(zmq=pub_url, replay=replay_url)],
            instance="sgl-0",
            model="m",
        )
        bridge = Bridge(config, kafka.for_source, kafka.flush).start()
        time.sleep(0.3)
        engine.publish(engine_batch(m, 10))
        wait_for(lambda: bridge.state.get(pub_url) == 11)
    finally:
        if bridge is not None:
            bridge.stop()
        engine.shutdown()
        truth.close()
    assert kafka.shutdown(10)

    envelopes = sorted(
        (
            r.envelope
            for r in read_envelopes(bootstrap_servers, ["kv-events"], topic_prefix=topic_prefix)
        ),
        key=lambda e: e.seq,
    )
    gaps = [e.body for e in envelopes if isinstance(e.body, Gap)]
    assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == [
        (0, 4, "replay_missing engine_seq=0-4")
    ]
    batches = [e.body for e in envelopes if isinstance(e.body, KVEventBatch)]
    assert [kvscope_batch(b) for b in batches] == [
        sglang_batch(m, truth.frames[s]) for s in range(5, 11)
    ]
    stored, removed = batches[0].events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert (stored.medium, stored.medium_raw) == ("CPU", "CPU_PINNED")
    assert (removed.medium, removed.medium_raw) == ("DISK", "DISK")
    assert stored.block_hashes == [(1 << 64) - 6, (1 << 62) + 5]
    assert {e.source.engine for e in envelopes} == {"sglang"}

"""Bridge gap repair against vLLM's own ZMQ publisher (its PUB socket and replay ring).

vLLM's `ZmqEventPublisher` is the engine-side code an unmodified vLLM runs; here it is
driven directly (no model) so the test can decide which batches the bridge misses:
everything published while no bridge is subscribed is dropped by ZMQ PUB, exactly as
when a bridge is stopped. Records are read back from the real broker, then stored by
the collector in chDB, where the completeness query must report the loss exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from kvscope.consumer import read_envelopes
from kvscope.publisher.bridge.loop import Bridge, BridgeConfig, Endpoint
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import Gap, KVEventBatch
from support.e2e_support import DirectSubscriber, collect, wait_for
from support.engine_truth import TruthBatch, kvscope_batch, vllm_batch
from vllm.distributed import kv_events  # vLLM's own publisher: the engine side of the test

pytestmark = pytest.mark.vllm


def engine_batch(i: int) -> object:
    """A realistic vLLM 0.32 batch: stores with >2**63 hashes, then a removal."""
    stored = kv_events.BlockStored(
        block_hashes=[(1 << 63) + 1000 * i + k for k in range(3)],
        parent_block_hash=None if i % 2 else (1 << 63) + i,
        token_ids=list(range(48)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    removed = kv_events.BlockRemoved(block_hashes=[(1 << 63) + 7 * i], medium="CPU")
    return kv_events.KVEventBatch(ts=1_700_000_000.0 + i, events=[stored, removed])


@pytest.fixture
def endpoints(tmp_path: Path) -> tuple[str, str]:
    return f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"


@pytest.fixture
def kafka(bootstrap_servers: str, topic_prefix: str) -> Iterator[KafkaPublisher]:
    publisher = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    yield publisher
    publisher.shutdown(5)


def run_bridge(config: BridgeConfig, kafka: KafkaPublisher) -> Bridge:
    return Bridge(config, kafka.for_source, kafka.flush).start()


def test_bridge_recovers_from_the_ring_and_records_exact_gaps(
    endpoints: tuple[str, str],
    kafka: KafkaPublisher,
    bootstrap_servers: str,
    topic_prefix: str,
    tmp_path: Path,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    pub_url, replay_url = endpoints
    engine = kv_events.ZmqEventPublisher(
        data_parallel_rank=0, endpoint=pub_url, replay_endpoint=replay_url, buffer_steps=20
    )
    truth = DirectSubscriber(pub_url)
    time.sleep(0.3)  # let the direct subscriber's subscription reach the PUB socket
    config = BridgeConfig(
        engine="vllm",
        endpoints=[Endpoint(zmq=pub_url, replay=replay_url)],
        instance="pod-a:8000",
        model="tiny",
        state_dir=str(tmp_path / "state"),
        checkpoint_interval_s=0.2,
    )

    def publish(batches: range) -> None:
        for i in batches:
            engine.publish(engine_batch(i))
        wait_for(lambda: len(truth.frames) and max(truth.frames) == batches[-1] % 100)

    try:
        publish(range(10))  # before the bridge runs: only the ring keeps them
        bridge = run_bridge(config, kafka)
        assert bridge.state.get(pub_url) == 10, "caught up from the ring at start"
        time.sleep(0.3)
        publish(range(10, 15))
        wait_for(lambda: bridge.state.get(pub_url) == 15)
        bridge.stop()
        publish(range(15, 45))  # bridge down: dropped by PUB, the ring (20) keeps 25..44
        bridge = run_bridge(config, kafka)  # catches up from 15 at once: 25..44, Gap 15..24
        assert bridge.state.get(pub_url) == 45
        time.sleep(0.3)
        publish(range(45, 48))
        wait_for(lambda: bridge.state.get(pub_url) == 48)
        first_run = dict(truth.frames)
        truth.frames.clear()
        engine.shutdown()
        engine = kv_events.ZmqEventPublisher(  # engine restart: seqs start at 0 again
            data_parallel_rank=0, endpoint=pub_url, replay_endpoint=replay_url, buffer_steps=20
        )
        time.sleep(0.5)
        publish(range(100, 104))
        wait_for(lambda: bridge.state.get(pub_url) == 4)
        bridge.stop()
    finally:
        engine.shutdown()
        truth.close()
    assert kafka.flush(10)

    records = read_envelopes(bootstrap_servers, ["kv-events"], topic_prefix=topic_prefix)
    assert all(r.envelope is not None for r in records)
    envelopes = [r.envelope for r in records]
    epochs = list(dict.fromkeys(e.epoch for e in envelopes))
    assert len(epochs) == 3, "bridge restart and engine restart each open an epoch"
    assert {e.source.instance for e in envelopes} == {"pod-a:8000"}
    assert {(e.source.model, e.source.dp_rank, e.source.engine) for e in envelopes} == {
        ("tiny", 0, "vllm")
    }

    def batches(epoch: int) -> list[KVEventBatch]:
        mine = sorted((e for e in envelopes if e.epoch == epoch), key=lambda e: e.seq)
        return [e.body for e in mine if isinstance(e.body, KVEventBatch)]

    def carried(epoch: int) -> list[TruthBatch]:
        return [kvscope_batch(b) for b in batches(epoch)]

    def expected(frames: dict[int, bytes], seqs: range) -> list[TruthBatch]:
        """What vLLM published, decoded with vLLM's own structs."""
        return [vllm_batch(frames[s]) for s in seqs]

    assert carried(epochs[0]) == expected(first_run, range(15))
    assert carried(epochs[1]) == expected(first_run, range(25, 48))
    gaps = [(e.epoch, e.body) for e in envelopes if isinstance(e.body, Gap)]
    assert len(gaps) == 1
    gap_epoch, gap = gaps[0]
    assert gap_epoch == epochs[1]
    assert gap.reason == "replay_missing engine_seq=15-24"
    assert (gap.first_seq, gap.last_seq) == (0, 9), "the 10 lost batches come first"
    assert carried(epochs[2]) == expected(truth.frames, range(4))
    for epoch in epochs:  # every epoch's seqs are complete: records plus Gap ranges
        seqs = {e.seq for e in envelopes if e.epoch == epoch}
        for e in envelopes:
            if e.epoch == epoch and isinstance(e.body, Gap):
                seqs |= set(range(e.body.first_seq, e.body.last_seq + 1))
        assert seqs == set(range(len(seqs)))

    stored = collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)
    assert stored == sum(len(b.events[0].block_hashes) + 1 for e in epochs for b in batches(e))
    report = {
        r["epoch"]: r
        for r in run_query(clickhouse, "completeness", {})
        if r["stream"] == "kv-events"
    }
    assert {
        epoch: (r["present"], r["declared_lost"], r["undeclared_missing"])
        for epoch, r in report.items()
    } == {epochs[0]: (15, 0, 0), epochs[1]: (23, 10, 0), epochs[2]: (4, 0, 0)}
    assert report[epochs[1]]["completeness"] == pytest.approx(23 / 33)
    reasons = clickhouse.query(
        "SELECT reason, first_seq, last_seq FROM stream_gaps WHERE detected_by = 'publisher'"
    ).result_rows
    assert reasons == [("replay_missing engine_seq=15-24", 0, 9)]

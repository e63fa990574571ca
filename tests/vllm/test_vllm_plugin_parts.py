"""The vLLM plugin's pieces with vLLM's real classes, no engine: registry wrap and stat logger.

Covers what the engine tests cannot reach on a CPU machine: data-parallel ranks other than
0 and KV-connector (NIXL) transfer stats. The stat logger gets a real `VllmConfig` built
on the tiny test model (tests/support/tinyllama.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from kvscope.local.demo_vllm import offline_vllm_env
from kvscope.publisher import PublisherConfig, shared_kafka_publisher
from kvscope.publisher.vllm import plugin as vllm_plugin
from kvscope.publisher.vllm.convert import kv_batch_from_vllm
from kvscope.publisher.vllm.kv_events import kvscope_constructor
from kvscope.publisher.vllm.stats import KvscopeStatLogger
from kvscope.schemas import (
    ConfigError,
    EngineStats,
    KVTransfer,
    RequestFinished,
    decode_engine_payload,
)
from support.publisher_readback import consume
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVEventBatch,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
)
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    PrefixCacheStats,
    SchedulerStats,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def kvscope_env(
    monkeypatch: pytest.MonkeyPatch, bootstrap_servers: str, topic_prefix: str
) -> Iterator[str]:
    monkeypatch.setenv("KVSCOPE_BOOTSTRAP_SERVERS", bootstrap_servers)
    monkeypatch.setenv("KVSCOPE_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("KVSCOPE_INSTANCE", "pod-9:8000")
    monkeypatch.setenv("KVSCOPE_MODEL", "tiny")
    monkeypatch.setenv("KVSCOPE_ROLE", "decode")
    monkeypatch.setitem(
        EventPublisherFactory._registry, "zmq", EventPublisherFactory._registry["zmq"]
    )
    yield topic_prefix
    config = PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    shared_kafka_publisher(config).shutdown(5.0)  # the plugin's sender: disconnect now


def test_register_without_brokers_only_adds_the_kvscope_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVSCOPE_BOOTSTRAP_SERVERS", raising=False)
    before = dict(EventPublisherFactory._registry)
    vllm_plugin.register()
    vllm_plugin.register()
    after = dict(EventPublisherFactory._registry)
    assert after.pop("kvscope") is kvscope_constructor
    assert after == {k: v for k, v in before.items() if k != "kvscope"}
    accepted = KVEventsConfig(
        enable_kv_cache_events=True, publisher="kvscope", endpoint="kafka://b:1"
    )
    assert accepted.publisher == "kvscope"
    with pytest.raises(ValueError, match="Input should be 'null', 'zmq' or 'kvscope'"):
        KVEventsConfig(enable_kv_cache_events=True, publisher="kafka")
    with pytest.raises(ConfigError, match="sidecar mode forwards"):
        monkeypatch.setenv("KVSCOPE_KV_EVENTS_SIDECAR", "1")
        EventPublisherFactory.create(accepted)


def test_wrapped_zmq_publisher_feeds_zmq_and_kafka_with_the_dp_rank(
    kvscope_env: str, bootstrap_servers: str
) -> None:
    original = EventPublisherFactory._registry["zmq"]
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM loads plugins in several places: wrap once
    wrapped = EventPublisherFactory._registry["zmq"]
    assert wrapped is not original
    assert getattr(wrapped, "__kvscope_tee__", False)

    endpoint = f"inproc://kvscope-{time.monotonic_ns()}"
    config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint)
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    publisher = EventPublisherFactory.create(config, data_parallel_rank=1)
    subscriber.connect(f"{endpoint}_dp1")  # vLLM offsets the endpoint per dp rank
    time.sleep(0.2)
    batch = KVEventBatch(
        ts=1_700_000_000.5,
        events=[
            BlockStored([2**64 - 5, 7], None, list(range(64)), 32, None, "GPU", None),
            BlockRemoved([3], "CPU"),
            AllBlocksCleared(),
        ],
    )
    publisher.publish(batch)
    assert subscriber.poll(5000), "vLLM's ZMQ publisher must still publish"
    _topic, _seq, payload = subscriber.recv_multipart()
    subscriber.close(linger=0)
    publisher.shutdown()

    expected = kv_batch_from_vllm(batch)
    assert decode_engine_payload(payload, "vllm") == expected
    [record] = consume(bootstrap_servers, [f"{kvscope_env}kv-events"], lambda r: len(r) >= 1)
    envelope = record.envelope
    assert envelope.body == expected
    assert envelope.body.events[0].token_count == 64
    assert envelope.body.events[0].token_ids is None
    assert (envelope.source.instance, envelope.source.dp_rank) == ("pod-9:8000", 1)
    assert (envelope.source.model, envelope.source.role) == ("tiny", "decode")
    assert envelope.ts == batch.ts
    assert record.key == b"pod-9:8000/1"


def real_vllm_config(model_dir: Path) -> Any:
    """vLLM's own `VllmConfig` for the tiny model: 100 blocks of 16, served as "served", NIXL.

    `num_gpu_blocks` is what vLLM sets after profiling the engine (no engine runs here).
    """
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig

    cache = CacheConfig(block_size=16)
    cache.num_gpu_blocks = 100
    return VllmConfig(
        model_config=ModelConfig(model=str(model_dir), served_model_name="served"),
        cache_config=cache,
        kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"),
    )


def step(queries: int, hits: int, finished: list[FinishedRequestStats], preempted: int = 0):  # type: ignore[no-untyped-def]
    prefix = PrefixCacheStats(requests=1, queries=queries, hits=hits)
    nixl = NixlKVConnectorStats()
    nixl.data["transfer_duration"].append(0.02)
    nixl.data["bytes_transferred"].append(65536)
    nixl.data["num_descriptors"].append(4)
    scheduler = SchedulerStats(
        num_running_reqs=2,
        num_waiting_reqs=1,
        num_skipped_waiting_reqs=1,
        kv_cache_usage=0.25,
        prefix_cache_stats=prefix,
        kv_connector_stats=nixl.to_dict(),
    )
    iteration = IterationStats()
    iteration.finished_requests = finished
    iteration.num_preempted_reqs = preempted
    return scheduler, iteration


def test_stat_logger_publishes_deltas_requests_and_connector_transfers(
    kvscope_env: str,
    bootstrap_servers: str,
    monkeypatch: pytest.MonkeyPatch,
    tiny_llama: Path,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("KVSCOPE_STATS_INTERVAL_S", "3600")
    monkeypatch.delenv("KVSCOPE_MODEL")
    for name, value in offline_vllm_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    logger = KvscopeStatLogger(real_vllm_config(tiny_llama), engine_index=2)
    logger.log_engine_initialized()
    done = FinishedRequestStats(
        finish_reason=FinishReason.LENGTH,
        request_id="req-1",
        e2e_latency=0.5,
        num_prompt_tokens=96,
        num_generation_tokens=8,
        queued_time=0.01,
        prefill_time=0.1,
        decode_time=0.3,
        num_cached_tokens=64,
    )
    for scheduler, iteration in (step(96, 64, [], preempted=1), step(32, 0, [done])):
        logger.record(scheduler, iteration, engine_idx=2)
    logger.log()  # interval not due yet: nothing
    logger.shutdown()  # the tail
    logger.shutdown()  # nothing new to publish

    topics = [f"{kvscope_env}{s}" for s in ("engine-stats", "requests", "kv-transfers")]
    records = consume(bootstrap_servers, topics, lambda r: len(r) >= 4)
    bodies = {type(r.envelope.body): [] for r in records}
    for r in records:
        bodies[type(r.envelope.body)].append(r.envelope.body)
    [stats] = bodies[EngineStats]
    assert (stats.prefix_queries_delta, stats.prefix_hits_delta, stats.preemptions_delta) == (
        128,
        64,
        1,
    )
    assert (stats.capacity_blocks, stats.block_size, stats.usage) == (100, 16, 0.25)
    assert (stats.running, stats.waiting) == (2, 2)
    [request] = bodies[RequestFinished]
    assert (request.request_id, request.prompt_tokens, request.cached_tokens) == ("req-1", 96, 64)
    assert (request.output_tokens, request.finish_reason) == (8, "length")
    assert request.ttft_s == pytest.approx(0.2)
    transfers: list[KVTransfer] = bodies[KVTransfer]
    assert [(t.backend, t.bytes, t.blocks, t.latency_s) for t in transfers] == [
        ("nixl", 65536, 4, 0.02)
    ] * 2
    assert {(t.dst_instance, t.src_instance) for t in transfers} == {("pod-9:8000", "")}
    assert {(r.envelope.source.dp_rank, r.envelope.source.model) for r in records} == {
        (2, "served")
    }

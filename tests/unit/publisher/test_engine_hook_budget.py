"""What each engine-thread hook may allocate per call, counted with tracemalloc, not timed.

A hook runs once per engine step (the KV-event tee's `publish_raw`) or once per request
(the access stream's `looked_up` and `released`) between the engine's own work, which
evicts the hook's code and data from the CPU caches: in a real engine a call costs what
its cold memory traffic costs (docs/benchmarks.md, "Engine overhead"), so what it touches
and allocates is the budget. Each hook gets two: the memory blocks a call leaves behind
(what it queues for the sender), and the bytes it needs at most while it runs (nothing
that grows with the prompt: block hashes are handed over, never copied, on the engine
thread). Prompt lengths are swept.

The publisher is the real one, on the session's broker, with a linger of a minute: after
one warm-up record its sender thread sleeps through the measurement, so tracemalloc (which
sees every thread) counts only the hook's allocations.
"""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from types import SimpleNamespace
from typing import Any

import kvscope.publisher
import pytest
from kvscope.publisher import PublisherConfig, SourcePublisher, shared_kafka_publisher
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.publisher.vllm.accesses import AccessRecorder
from kvscope.schemas import KVEventBatch, Source

CALLS = 400
BLOCK_SIZE = 32


@pytest.fixture(scope="module")
def kafka(broker: Any) -> Iterator[KafkaPublisher]:
    config = PublisherConfig(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"budget-{time.monotonic_ns()}.",
        linger_ms=60_000.0,
    )
    publisher = KafkaPublisher(config)
    yield publisher
    publisher.queue.clear()
    publisher.shutdown(2.0)


@pytest.fixture
def source(kafka: KafkaPublisher) -> Iterator[SourcePublisher]:
    """A source whose sender has delivered a warm-up record (it is connected) and now
    lingers a minute before it looks at the queue again."""
    publisher = kafka.for_source(Source(instance="budget:1", model="m"))
    publisher.publish_raw("kv-events", KVEventBatch(ts=1.0, events=[]), 1.0, lambda raw: raw)
    assert kafka.flush(10.0)
    yield publisher
    kafka.queue.clear()


def _requests(count: int, blocks: int) -> list[Any]:
    """Finished-request stand-ins with the fields vLLM's `Request` gives the recorder."""
    hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(blocks)]
    return [
        SimpleNamespace(
            request_id=f"cmpl-{i:08d}-0a1b2c3d",
            num_preemptions=0,
            num_prompt_tokens=blocks * BLOCK_SIZE,
            num_computed_tokens=blocks * BLOCK_SIZE,
            block_hashes=list(hashes),
            arrival_time=1_700_000_000.5,
            session_id=None,
            cache_salt=None,
        )
        for i in range(count)
    ]


PUBLISHER_FILES = str(Path(kvscope.publisher.__file__).parent / "*")


def _publisher_blocks() -> int:
    """Memory blocks alive now that were allocated from a line of kvscope's publisher."""
    snapshot = tracemalloc.take_snapshot()
    return len(snapshot.filter_traces([tracemalloc.Filter(True, PUBLISHER_FILES)]).traces)


def _measure(call: Callable[[int], None]) -> tuple[float, int]:
    """(memory blocks left behind per call, median transient bytes of a call).

    The median leaves out the amortized growth of a dict or deque that some calls pay. Blocks
    left behind count only those allocated from kvscope's publisher code: threads other
    tests left running (tracemalloc sees every thread) would otherwise add their own.
    """
    call(0)  # first-call caches (metric children, dict growth) are not per-call cost
    tracemalloc.start()
    try:
        transients = []
        before = _publisher_blocks()
        for i in range(1, CALLS + 1):
            current, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            call(i)
            after, peak = tracemalloc.get_traced_memory()
            transients.append(peak - max(current, after))
        left = _publisher_blocks() - before
    finally:
        tracemalloc.stop()
    print(f"{left / CALLS:.2f} blocks left per call, median transient {median(transients)} B")
    return left / CALLS, int(median(transients))


@pytest.mark.parametrize("blocks", [1, 13, 400])
def test_the_tee_queues_a_batch_within_its_budget(source: SourcePublisher, blocks: int) -> None:
    batches = [SimpleNamespace(ts=1.0 + i, events=[0] * blocks) for i in range(CALLS + 1)]

    def publish(i: int) -> None:
        source.publish_raw("kv-events", batches[i], batches[i].ts, _never)

    per_call, transient = _measure(publish)
    assert per_call <= 2.5, "a queued item, its enqueue time and its seq (1.4 measured)"
    assert transient <= 160, "nothing proportional to the batch (136 measured)"


@pytest.mark.parametrize("blocks", [1, 13, 400])
def test_the_access_observers_stay_within_their_budget(
    source: SourcePublisher, blocks: int
) -> None:
    recorder = AccessRecorder(source, BLOCK_SIZE)
    requests = _requests(CALLS + 1, blocks)

    def held(request_id: str) -> int:
        return blocks

    per_lookup, lookup_transient = _measure(lambda i: recorder.looked_up(requests[i], 0))
    assert per_lookup <= 2.0, "one (time, hits) pair, its float from the free list or not (0.77)"
    assert lookup_transient <= 64, "0 measured"
    per_release, release_transient = _measure(lambda i: recorder.released(requests[i], held))
    assert per_release <= 4.0, "the release tuple, a queued item, times, seq (2.36)"
    assert release_transient <= 160, "nothing proportional to the prompt (136; 376 with kwargs)"
    assert recorder.pending() == 0


def _never(raw: Any) -> Any:
    raise AssertionError("the sender converts, never the engine thread")


@pytest.mark.vllm
def test_the_stat_logger_records_a_step_within_its_budget(
    kafka: KafkaPublisher, monkeypatch: pytest.MonkeyPatch, tiny_llama: Any, tmp_path: Any
) -> None:
    """`record()` runs once per engine step (in `vllm serve`, on the front end's output
    thread); a finished request is handed to the sender as vLLM's own stats object."""
    from kvscope.local.demo_vllm import offline_vllm_env
    from kvscope.publisher.vllm.stats import KvscopeStatLogger
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import (
        FinishedRequestStats,
        IterationStats,
        PrefixCacheStats,
        SchedulerStats,
    )

    for name, value in offline_vllm_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    config = kafka.config
    monkeypatch.setenv("KVSCOPE_BOOTSTRAP_SERVERS", config.bootstrap_servers)
    monkeypatch.setenv("KVSCOPE_TOPIC_PREFIX", config.topic_prefix)
    monkeypatch.setenv("KVSCOPE_LINGER_MS", "60000")
    monkeypatch.setenv("KVSCOPE_STATS_INTERVAL_S", "3600")
    cache = CacheConfig(block_size=16)
    cache.num_gpu_blocks = 100
    model = ModelConfig(model=str(tiny_llama), served_model_name="served")
    logger = KvscopeStatLogger(VllmConfig(model_config=model, cache_config=cache))
    steps = []
    for i in range(CALLS + 1):
        iteration = IterationStats()
        iteration.finished_requests = [
            FinishedRequestStats(
                finish_reason=FinishReason.LENGTH,
                request_id=f"req-{i}",
                e2e_latency=0.5,
                num_prompt_tokens=96,
                num_generation_tokens=8,
                num_cached_tokens=64,
            )
        ]
        prefix = PrefixCacheStats(requests=1, queries=96, hits=64)
        steps.append((SchedulerStats(prefix_cache_stats=prefix), iteration))
    assert kafka.flush(10.0)

    try:
        per_step, transient = _measure(lambda i: logger.record(*steps[i]))
    finally:
        shared_kafka_publisher(PublisherConfig.from_env()).shutdown(2.0)
    assert per_step <= 3.5, "a queued item, its time, its seq (2.4-2.9; 4.8 building the body)"
    assert transient <= 256, "no RequestFinished built here (224 B measured)"

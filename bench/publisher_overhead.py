"""What kvscope's publisher costs the engine, next to vLLM's own ZMQ publisher, same run.

Both publishers get identical vLLM-shaped batches (vLLM's own `KVEventBatch` structs:
BlockStored with token ids as vLLM sends them, 1-8 blocks per event, block size 16 or 32,
single-block BlockRemoved events as vLLM evicts them, 1-40 blocks per batch, shapes as in
the real captures under tests/data/vllm/), paced at about one batch per millisecond, the
rate of a busy engine step loop.

- vLLM: `ZmqEventPublisher` (its PUB socket has a subscriber in another process, so
  frames are really sent);
- kvscope: the path the vLLM plugin takes, `SourcePublisher.publish_raw(batch, convert)`
  into a `KafkaPublisher` sending to a real local broker (another process).

Measured per publisher: the caller thread's time inside `publish()` (p50, p99, max) and
the whole process's CPU time (all threads, until everything is delivered) per block
event, minus the CPU of the same pacing loop with a no-op publisher. Usage:

    python bench/publisher_overhead.py [--batches 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kvscope.local.broker import LocalBroker
from kvscope.publisher import KafkaPublisher, PublisherConfig
from kvscope.publisher.vllm.convert import kv_batch_from_vllm
from kvscope.schemas import Source

PACE_S = 0.001


def make_batches(count: int, seed: int = 7) -> list[Any]:
    """vLLM `KVEventBatch` objects of 1-40 blocks, as a prefix-caching engine emits them."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    rng = random.Random(seed)
    batches = []
    for _ in range(count):
        blocks = min(40, max(1, int(rng.lognormvariate(1.8, 0.9))))
        block_size = rng.choice((16, 32))
        events: list[Any] = []
        removed = rng.randint(0, blocks // 2)
        stored = blocks - removed
        parent = None
        while stored > 0:
            n = min(stored, rng.randint(1, 8))
            hashes = [rng.getrandbits(64) for _ in range(n)]
            tokens = [rng.randrange(32_000) for _ in range(n * block_size)]
            events.append(BlockStored(hashes, parent, tokens, block_size, None, "GPU", None))
            parent, stored = hashes[-1], stored - n
        events += [BlockRemoved([rng.getrandbits(64)], "GPU") for _ in range(removed)]
        batches.append(KVEventBatch(ts=time.time(), events=events))
    return batches


def block_events(batches: list[Any]) -> int:
    return sum(len(e.block_hashes) for b in batches for e in b.events)


def paced(publish: Callable[[Any], None], batches: list[Any]) -> list[int]:
    """Call `publish` once per batch, one batch per PACE_S; return each call's duration (ns)."""
    durations = []
    next_at = time.perf_counter()
    for batch in batches:
        started = time.perf_counter_ns()
        publish(batch)
        durations.append(time.perf_counter_ns() - started)
        next_at += PACE_S
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return durations


def _subscribe(endpoint: str, expected: int, ready: Any, done: Any) -> None:
    import zmq

    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(endpoint)
    ready.set()
    received = 0
    while received < expected and socket.poll(10_000):
        socket.recv_multipart()
        received += 1
    done.put(received)


def run_zmq(batches: list[Any], workdir: str) -> tuple[list[int], float, int]:
    from vllm.distributed.kv_events import ZmqEventPublisher

    endpoint = f"ipc://{workdir}/zmq-{time.monotonic_ns()}"
    publisher = ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint)
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Queue()
    subscriber = context.Process(target=_subscribe, args=(endpoint, len(batches), ready, done))
    subscriber.start()
    ready.wait(30)
    time.sleep(0.5)
    cpu = time.process_time()
    durations = paced(publisher.publish, batches)
    received = done.get(timeout=60)
    cpu = time.process_time() - cpu
    publisher.shutdown()
    subscriber.join()
    return durations, cpu, received


def run_kafka(batches: list[Any], broker: LocalBroker) -> tuple[list[int], float, int]:
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=broker.bootstrap_servers, topic_prefix="bench.")
    )
    source = kafka.for_source(Source(instance="bench:8000", model="m"))
    convert = functools.partial(kv_batch_from_vllm, keep_token_ids=False)
    source.publish_raw("kv-events", batches[0], None, convert)
    assert kafka.flush(30), "warm-up record not delivered"
    before = kafka.metrics.published.labels(stream="kv-events")._value.get()
    cpu = time.process_time()
    durations = paced(lambda b: source.publish_raw("kv-events", b, b.ts, convert), batches)
    assert kafka.flush(60), "not everything was delivered"
    cpu = time.process_time() - cpu
    delivered = int(kafka.metrics.published.labels(stream="kv-events")._value.get() - before)
    kafka.shutdown(10)
    return durations, cpu, delivered


def run_null(batches: list[Any]) -> tuple[list[int], float, int]:
    cpu = time.process_time()
    durations = paced(lambda batch: None, batches)
    return durations, time.process_time() - cpu, len(batches)


def summary(name: str, runs: list[tuple[list[int], float, int]], blocks: int, base: float) -> dict:
    durations = sorted(d for run in runs for d in run[0])
    cpu = statistics.mean(run[1] for run in runs)
    return {
        "publisher": name,
        "delivered": [run[2] for run in runs],
        "caller_p50_us": durations[len(durations) // 2] / 1e3,
        "caller_p99_us": durations[int(len(durations) * 0.99)] / 1e3,
        "caller_max_us": durations[-1] / 1e3,
        "cpu_s": cpu,
        "cpu_per_block_us": (cpu - base) / blocks * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    args = parser.parse_args()
    batches = make_batches(args.batches)
    blocks = block_events(batches)
    results: dict[str, list] = {"null": [], "zmq": [], "kafka": []}
    with tempfile.TemporaryDirectory() as workdir, LocalBroker() as broker:
        for _ in range(args.rounds):
            results["null"].append(run_null(batches))
            results["zmq"].append(run_zmq(batches, workdir))
            results["kafka"].append(run_kafka(batches, broker))
    base = statistics.mean(run[1] for run in results["null"])
    rows = [
        summary("vLLM ZmqEventPublisher", results["zmq"], blocks, base),
        summary("kvscope KafkaPublisher", results["kafka"], blocks, base),
    ]
    zmq, kafka = rows
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "batches": args.batches,
        "rounds": args.rounds,
        "block_events_per_run": blocks,
        "pacing_loop_cpu_s": base,
        "rows": rows,
        "caller_p99_ratio": kafka["caller_p99_us"] / zmq["caller_p99_us"],
        "cpu_per_block_ratio": kafka["cpu_per_block_us"] / zmq["cpu_per_block_us"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

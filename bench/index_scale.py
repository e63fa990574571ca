"""The prefix index at fleet scale, against a naive dict-of-sets index in the same run.

Fleet: S sources, each with R resident blocks in two tiers (60% GPU, 40% a CPU offload
tier holding blocks evicted from the GPU), 2% of every source's GPU blocks from a prefix
all sources share. The fill publishes the resident sets as 16-block BlockStored events;
the churn then runs steady state: each record stores 16 new GPU blocks, evicts the 16
oldest to the CPU tier (BlockRemoved GPU + BlockStored CPU) and drops the 16 oldest CPU
blocks, i.e. 64 block events per record. Records are msgpack-encoded up front; applying
counts decoding them too (as the Kafka feed does).

Measured, for kvscope's `PrefixIndex` and for the baseline (a dict of sets per hash and per
source, the shape the issue measured at 214k events/CPU-s and 257 B/entry):
- block events applied per CPU-second (fill and churn);
- bytes per resident (block, source) entry: process RSS growth over the fill, and the
  table's own arrays for kvscope;
- score latency (p50/p99) of 100-block requests over all sources;
- with --cold-start, the stored events are written to chDB through the collector's own
  decode and column code and a fresh index loads them (`index.stored`), timed.

    python bench/index_scale.py [--sources 64] [--resident 250000] [--baseline-resident 50000]
                                [--churn-records 20000] [--cold-start]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Source, decode, encode
from kvscope.schemas.wire import BlockRemoved, BlockStored, KVEventBatch

CHAIN = 16


class NaiveIndex:
    """The baseline: per hash the set of (source, tier) holding it, per source its sets."""

    def __init__(self) -> None:
        self.holders: dict[int, set[tuple[str, str]]] = {}
        self.per_source: dict[str, dict[str, set[int]]] = {}

    def apply_all(self, envelopes: Sequence[Envelope]) -> None:
        """Apply stores and removals (no epochs or copies: the baseline's best case)."""
        for envelope in envelopes:
            source = envelope.source.key
            tiers = self.per_source.setdefault(source, {})
            for event in envelope.body.events:  # type: ignore[union-attr]
                held = tiers.setdefault(event.medium, set())
                key = (source, event.medium)
                if isinstance(event, BlockStored):
                    for h in event.block_hashes:
                        held.add(h)
                        self.holders.setdefault(h, set()).add(key)
                else:
                    for h in event.block_hashes:
                        held.discard(h)
                        who = self.holders.get(h)
                        if who is not None:
                            who.discard(key)
                            if not who:
                                del self.holders[h]

    def score(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks held per source (any tier)."""
        matched: dict[str, int] = {}
        active: set[str] | None = None
        for n, h in enumerate(hashes):
            here = {source for source, _ in self.holders.get(h, ())}
            active = here if active is None else active & here
            if not active:
                break
            for source in active:
                matched[source] = n + 1
        return matched


def fleet(
    sources: int, resident: int, churn_records: int, seed: int
) -> tuple[list[bytes], list[bytes], list[list[int]]]:
    """Encoded fill records, churn records, and each source's GPU chain (for requests)."""
    rng = random.Random(seed)
    gpu_n = int(resident * 0.6) // CHAIN * CHAIN
    cpu_n = (resident - gpu_n) // CHAIN * CHAIN
    shared = [rng.getrandbits(64) for _ in range(max(CHAIN, gpu_n // 50 // CHAIN * CHAIN))]
    fill: list[bytes] = []
    churn: list[bytes] = []
    chains: list[list[int]] = []
    seqs = [0] * sources
    who = [Source(instance=f"engine-{i:03d}", model="m") for i in range(sources)]

    def record(i: int, events: list[Any]) -> bytes:
        envelope = Envelope(
            source=who[i],
            epoch=i + 1,
            seq=seqs[i],
            ts=1.7e9 + seqs[i],
            body=KVEventBatch(ts=0, events=events),
        )
        seqs[i] += 1
        return encode(envelope)

    gpu_queues: list[list[int]] = []
    cpu_queues: list[list[int]] = []
    for i in range(sources):
        gpu = shared + [rng.getrandbits(64) for _ in range(gpu_n - len(shared))]
        cpu = [rng.getrandbits(64) for _ in range(cpu_n)]
        for start in range(0, cpu_n, CHAIN):
            fill.append(
                record(
                    i,
                    [
                        BlockStored(
                            block_hashes=cpu[start : start + CHAIN], block_size=16, medium="CPU"
                        )
                    ],
                )
            )
        for start in range(0, gpu_n, CHAIN):
            fill.append(
                record(i, [BlockStored(block_hashes=gpu[start : start + CHAIN], block_size=16)])
            )
        gpu_queues.append(gpu)
        cpu_queues.append(cpu)
        chains.append(gpu)
    heads = [0] * sources
    cpu_heads = [0] * sources
    for n in range(churn_records):
        i = n % sources
        new = [rng.getrandbits(64) for _ in range(CHAIN)]
        gpu, cpu = gpu_queues[i], cpu_queues[i]
        evicted = gpu[heads[i] : heads[i] + CHAIN]
        dropped = cpu[cpu_heads[i] : cpu_heads[i] + CHAIN]
        heads[i] += CHAIN
        cpu_heads[i] += CHAIN
        gpu.extend(new)
        cpu.extend(evicted)
        churn.append(
            record(
                i,
                [
                    BlockStored(block_hashes=new, block_size=16),
                    BlockRemoved(block_hashes=evicted),
                    BlockStored(block_hashes=evicted, block_size=16, medium="CPU"),
                    BlockRemoved(block_hashes=dropped, medium="CPU"),
                ],
            )
        )
    live_chains = [gpu[heads[i] :] for i, gpu in enumerate(gpu_queues)]
    del chains
    return fill, churn, live_chains


def rss_bytes() -> int:
    """The process's resident set size now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def apply_rate(
    apply: Callable[[list[Envelope]], None], records: list[bytes], per_record: int
) -> float:
    """Block events applied per CPU-second, decoding included (batches of 500 records)."""
    started = time.process_time()
    for start in range(0, len(records), 500):
        apply([decode(r) for r in records[start : start + 500]])
    return len(records) * per_record / (time.process_time() - started)


def score_latency(
    score: Callable[[list[int]], Any], chains: list[list[int]], n: int, seed: int
) -> tuple[float, float]:
    """p50 and p99 (µs) of `n` 100-block requests drawn from the sources' live GPU chains."""
    rng = random.Random(seed)
    times = []
    cpu = []
    for _ in range(n):
        chain = chains[rng.randrange(len(chains))]
        start = rng.randrange(0, max(1, len(chain) - 100)) // CHAIN * CHAIN
        request = chain[start : start + 100]
        if rng.random() < 0.3:  # a partly new prompt
            request = request[: rng.randrange(100)] + [rng.getrandbits(64) for _ in range(100)]
            request = request[:100]
        t0, c0 = time.perf_counter(), time.thread_time()
        score(request)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    p50, p99 = np.percentile(np.array(times), [50, 99]) * 1e6
    cpu_p99 = float(np.percentile(np.array(cpu), 99) * 1e6)
    return float(p50), float(p99), cpu_p99


def measure(
    kind: str, sources: int, resident: int, churn_records: int, seed: int
) -> dict[str, Any]:
    """Fill, churn and score one index; its figures."""
    fill, churn, chains = fleet(sources, resident, churn_records, seed)
    gc.collect()
    index: Any = PrefixIndex() if kind == "kvscope" else NaiveIndex()
    if kind == "kvscope":  # compile (or load) every kernel outside the measurement
        warm = PrefixIndex()
        warm.apply_all([decode(r) for r in fill[:2000]])
        warm.score(chains[0][:100])
        warm.resident("engine-000", 0)
        warm.apply_all([decode(r) for r in churn[:100]])
    before = rss_bytes()
    fill_rate = apply_rate(index.apply_all, fill, CHAIN)
    gc.collect()
    grown = rss_bytes() - before
    entries = sources * (len(fill) // sources) * CHAIN
    churn_rate = apply_rate(index.apply_all, churn, 4 * CHAIN)
    p50, p99, cpu_p99 = score_latency(index.score, chains, 5000, seed)
    figures = {
        "index": kind,
        "sources": sources,
        "entries": entries,
        "fill_events_per_cpu_s": fill_rate,
        "churn_events_per_cpu_s": churn_rate,
        "rss_bytes_per_entry": grown / entries,
        "score_p50_us": p50,
        "score_p99_us": p99,
        "score_cpu_p99_us": cpu_p99,
    }
    if kind == "kvscope":
        figures["table_bytes_per_entry"] = index.table.nbytes() / entries
    return figures


def cold_start(sources: int, resident: int, churn_records: int, seed: int) -> dict[str, float]:
    """Store the fleet's events in chDB (collector code), then load a fresh index from it."""
    from kvscope.collector.pipeline.direct_sink import DirectSink
    from kvscope.collector.storage.migrate import migrate
    from kvscope.collector.storage.tables import KV_BLOCK_EVENTS
    from kvscope.collector.storage.target import connect, parse_target
    from kvscope.index.stored import load, read_snapshot

    fill, churn, _ = fleet(sources, resident, churn_records, seed)
    path = tempfile.mkdtemp(prefix="kvscope-index-bench-")
    try:
        target = parse_target(f"chdb://{path}")
        client = connect(target)
        migrate(client, target)
        sink = DirectSink(client, batch=200_000)
        t0 = time.perf_counter()
        for record in fill + churn:
            envelope = decode(record)
            sink(envelope.source, envelope.epoch, envelope.body, envelope.ts)
        sink.close()
        stored_s = time.perf_counter() - t0
        rows = client.query(f"SELECT count() FROM {KV_BLOCK_EVENTS.name}").result_rows[0][0]
        t0 = time.perf_counter()
        snapshot = read_snapshot(client, "kvscope.kv-events")
        read_s = time.perf_counter() - t0
        index = PrefixIndex()
        t0 = time.perf_counter()
        applied = load(index, snapshot)
        load_s = time.perf_counter() - t0
        return {
            "stored_rows": rows,
            "store_s": stored_s,
            "events_applied": applied,
            "resident_entries": sum(info.resident for info in index.sources()),
            "read_s": read_s,
            "load_s": load_s,
            "cold_start_s": read_s + load_s,
        }
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sources", type=int, default=64)
    parser.add_argument("--resident", type=int, default=250_000)
    parser.add_argument("--baseline-resident", type=int, default=50_000)
    parser.add_argument("--churn-records", type=int, default=20_000)
    parser.add_argument("--cold-start", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    host = f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cpus"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# index_scale {when} on {host}, python {platform.python_version()}")
    rows = [
        measure("naive", args.sources, args.baseline_resident, args.churn_records, args.seed),
        measure("kvscope", args.sources, args.baseline_resident, args.churn_records, args.seed),
        measure("kvscope", args.sources, args.resident, args.churn_records, args.seed),
    ]
    print(msgspec.json.format(msgspec.json.encode(rows)).decode())
    base = rows[0]
    for row in rows[1:]:
        fill = row["fill_events_per_cpu_s"] / base["fill_events_per_cpu_s"]
        churn = row["churn_events_per_cpu_s"] / base["churn_events_per_cpu_s"]
        print(
            f"{row['entries']:,} entries: fill x{fill:.1f}, churn x{churn:.1f}, bytes/entry "
            f"{row['rss_bytes_per_entry']:.1f} (table {row['table_bytes_per_entry']:.1f}) vs "
            f"{base['rss_bytes_per_entry']:.1f}, score p99 {row['score_p99_us']:.0f} us "
            f"(CPU {row['score_cpu_p99_us']:.0f}) vs {base['score_p99_us']:.0f} us "
            f"(CPU {base['score_cpu_p99_us']:.0f})"
        )
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.cold_start:
        print(
            msgspec.json.encode(
                cold_start(args.sources, args.resident, args.churn_records, args.seed)
            ).decode()
        )


if __name__ == "__main__":
    main()

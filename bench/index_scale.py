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
  decode and column code and a fresh index loads them (`index.stored`), timed;
- with --score-while-churning, score latency while the feed applies churn. The index
  service runs its Kafka feed and its HTTP answers on one event loop: the feed applies a
  fetched chunk (at most `feed.MAX_RECORDS` records), then yields (`await asyncio.sleep(0)`),
  and every request waiting gets its turn before the next chunk. So a score never runs
  concurrently with an apply; it runs between chunks, on a table the chunk just changed
  (caches cold, sets and copies moved). The phase takes those turns in order: one chunk
  of `--churn-batch` records through the feed's own apply step (`IndexFeed._apply`: decode
  and `PrefixIndex.apply_all`), then one request per client (`--clients`), and so on;
  scores without churn on the same index follow, for the ratio. The chunk's apply time is
  reported too: the longest a request arriving mid-chunk waits for its turn;
- with --fleet-sources N, pod churn: N sources registered and filled (the live ones, the
  first fleet, spread among them so their slots and numbers are not the lowest), then all
  but the live ones expired through `PrefixIndex.forget_idle`, then one live source
  restarts (a new epoch); for each, the event-loop turns it took (the change's own turn,
  then every sweep step, wall and thread CPU; the longest is what an answer can wait);
  then its scores against an index fed only the live sources (and the same restart), the
  same requests alternating between the two.

    python bench/index_scale.py [--sources 64] [--resident 250000] [--baseline-resident 50000]
                                [--churn-records 20000] [--cold-start] [--score-while-churning
                                [--churn-batch 100] [--clients 10]] [--fleet-sources 3000
                                [--idle-resident 2000]] [--only-kvscope]
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
from typing import Any, NamedTuple

import msgspec
import numpy as np
from aiokafka import TopicPartition
from kvscope.common.kafka import KafkaSettings
from kvscope.index.feed import IndexFeed
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
    sources: int, resident: int, churn_records: int, seed: int, name: str = "engine"
) -> tuple[list[bytes], list[bytes], list[list[int]]]:
    """Encoded fill records (each source's in a row, as many for each), churn records, and
    each source's GPU chain (for requests)."""
    rng = random.Random(seed)
    gpu_n = int(resident * 0.6) // CHAIN * CHAIN
    cpu_n = (resident - gpu_n) // CHAIN * CHAIN
    shared = [rng.getrandbits(64) for _ in range(max(CHAIN, gpu_n // 50 // CHAIN * CHAIN))]
    fill: list[bytes] = []
    churn: list[bytes] = []
    chains: list[list[int]] = []
    seqs = [0] * sources
    who = [Source(instance=f"{name}-{i:04d}", model="m") for i in range(sources)]

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


def requests(chains: list[list[int]], n: int, seed: int) -> list[list[int]]:
    """`n` 100-block requests drawn from the sources' live GPU chains, 30% partly new."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chain = chains[rng.randrange(len(chains))]
        start = rng.randrange(0, max(1, len(chain) - 100)) // CHAIN * CHAIN
        request = chain[start : start + 100]
        if rng.random() < 0.3:  # a partly new prompt
            request = request[: rng.randrange(100)] + [rng.getrandbits(64) for _ in range(100)]
            request = request[:100]
        out.append(request)
    return out


class Timings:
    """Wall and thread-CPU times of repeated calls, in µs percentiles."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def time(self, call: Callable[[], Any]) -> Any:
        """Run `call` once, recording its times; its result. The wall clock is read inside
        the CPU clock's reads, so their cost (~0.5 µs each here) stays out of the wall time."""
        c0 = time.thread_time()
        t0 = time.perf_counter()
        result = call()
        wall = time.perf_counter() - t0
        self.cpu.append(time.thread_time() - c0)
        self.wall.append(wall)
        return result

    def figures(self, prefix: str) -> dict[str, float]:
        """p50 and p99 wall, p99 thread CPU (µs), keyed `{prefix}_p50_us` and so on."""
        p50, p99 = np.percentile(np.array(self.wall), [50, 99]) * 1e6
        cpu_p99 = np.percentile(np.array(self.cpu), 99) * 1e6
        return {
            f"{prefix}_p50_us": float(p50),
            f"{prefix}_p99_us": float(p99),
            f"{prefix}_cpu_p99_us": float(cpu_p99),
        }


def score_latency(
    score: Callable[[list[int]], Any], chains: list[list[int]], n: int, seed: int
) -> dict[str, float]:
    """Score p50/p99 and CPU p99 (µs) of `n` requests from the sources' live GPU chains."""
    timings = Timings()
    for request in requests(chains, n, seed):
        timings.time(lambda request=request: score(request))
    return timings.figures("score")


class _Message(NamedTuple):
    """The two fields of a fetched Kafka record the feed's apply step reads."""

    value: bytes
    offset: int


def score_while_churning(
    sources: int, resident: int, churn_records: int, batch: int, clients: int, seed: int
) -> dict[str, Any]:
    """Fill, then churn through the feed's apply step in chunks of `batch` records, each
    chunk followed by one score request per client (the event loop's turns); then the same
    number of scores without churn, for the ratio."""
    fill, churn, chains = fleet(sources, resident, churn_records, seed)
    index = PrefixIndex()
    for start in range(0, len(fill), 500):
        index.apply_all([decode(r) for r in fill[start : start + 500]])
    del fill
    gc.collect()
    index.score(chains[0][:100])
    # never started: only its apply step is used, on records as a fetch returns them
    feed = IndexFeed(index, KafkaSettings(bootstrap_servers="127.0.0.1:9"), "kvscope.kv-events")
    partition = TopicPartition("kvscope.kv-events", 0)
    asked = requests(chains, (len(churn) // batch + 1) * clients, seed)
    during, chunks, without = Timings(), Timings(), Timings()
    n = 0
    churn_cpu = time.process_time()
    for start in range(0, len(churn), batch):
        messages = [_Message(r, start + i) for i, r in enumerate(churn[start : start + batch])]
        chunks.time(lambda messages=messages: feed._apply({partition: messages}))
        for _ in range(clients):
            during.time(lambda request=asked[n]: index.score(request))
            n += 1
    churn_cpu = time.process_time() - churn_cpu - sum(during.cpu)
    for request in asked[:n]:
        without.time(lambda request=request: index.score(request))
    figures = {
        "phase": "score while churning",
        "sources": sources,
        "entries": index.table.entries,
        "churn_batch_records": batch,
        "clients": clients,
        "scores": n,
        "churn_events_per_cpu_s": len(churn) * 4 * CHAIN / churn_cpu,
        **during.figures("score_churning"),
        **without.figures("score_quiet"),
        **chunks.figures("chunk_apply"),
    }
    figures["churning_over_quiet_p50"] = (
        figures["score_churning_p50_us"] / figures["score_quiet_p50_us"]
    )
    return figures


def idle_fleet(
    live: int, resident: int, total: int, idle_resident: int, churn_records: int, seed: int
) -> dict[str, Any]:
    """`total` sources registered and filled, all but the `live` ones then expired, against
    an index that only ever saw the live ones; the same requests alternate between them."""
    fill, churn, chains = fleet(live, resident, churn_records, seed)
    idle_fill, _, _ = fleet(total - live, idle_resident, 0, seed + 1, name="idle")
    per_live, per_idle = len(fill) // live, len(idle_fill) // (total - live)
    alone, churned = PrefixIndex(), PrefixIndex()
    for start in range(0, len(fill), 500):
        alone.apply_all([decode(r) for r in fill[start : start + 500]])
    # register every source, the live ones spread among the idle ones
    spread = {int(j * total / live) for j in range(live)}
    firsts, j, i = [], 0, 0
    for n in range(total):
        if n in spread:
            firsts.append(fill[j * per_live])
            j += 1
        else:
            firsts.append(idle_fill[i * per_idle])
            i += 1
    churned.apply_all([decode(r) for r in firsts])
    rest = [
        r for i in range(total - live) for r in idle_fill[i * per_idle + 1 : (i + 1) * per_idle]
    ]
    for start in range(0, len(rest), 500):
        churned.apply_all([decode(r) for r in rest[start : start + 500]])
    del rest, idle_fill
    peak = {"sources": len(churned.sources()), "slots": churned.live_slots}
    split = time.monotonic()
    rest = [r for j in range(live) for r in fill[j * per_live + 1 : (j + 1) * per_live]]
    for start in range(0, len(rest), 500):
        churned.apply_all([decode(r) for r in rest[start : start + 500]])
    del rest, fill
    for start in range(0, len(churn), 500):
        batch = [decode(r) for r in churn[start : start + 500]]
        alone.apply_all(batch)
        churned.apply_all(batch)
    gc.collect()
    forgotten, forget_turns = loop_turns(lambda: len(churned.forget_idle(0.0, now=split)), churned)
    restarted, epoch_turns = new_epoch(churned, alone)
    timings = {"alone": Timings(), "churned": Timings()}
    same = True
    for n, request in enumerate(requests(chains, 5000, seed)):
        first, second = ("alone", "churned") if n % 2 else ("churned", "alone")
        answers = {}
        for kind in (first, second):
            index = alone if kind == "alone" else churned
            answers[kind] = timings[kind].time(lambda i=index, r=request: i.score(r))
        same = same and answers["alone"].sources == answers["churned"].sources
    figures = {
        "phase": "pod churn",
        "registered": peak["sources"],
        "slots_at_peak": peak["slots"],
        "forgotten": forgotten,
        **forget_turns.figures("forget"),
        "restarted": restarted,
        **epoch_turns.figures("new_epoch"),
        "live": len(churned.sources()),
        "entries": churned.table.entries,
        "slots_churned": churned.live_slots,
        "max_slots_churned": churned.table.max_slots,
        "max_slots_alone": alone.table.max_slots,
        "table_bytes_churned": churned.table.nbytes(),
        "table_bytes_alone": alone.table.nbytes(),
        "answers_equal": same,
        **timings["churned"].figures("score_churned"),
        **timings["alone"].figures("score_alone"),
    }
    figures["churned_over_alone_p50"] = (
        figures["score_churned_p50_us"] / figures["score_alone_p50_us"]
    )
    return figures


class Turns:
    """The event-loop turns one lifecycle change took: the change itself, then each sweep
    step (as the index service runs them, one per turn), wall and thread-CPU seconds."""

    def __init__(self) -> None:
        self.first = Timings()
        self.steps = Timings()

    def figures(self, prefix: str) -> dict[str, float]:
        """The longest turn, the change's own, the longest sweep step, the steps and their
        total (ms)."""
        wall, cpu = self.steps.wall or [0.0], self.steps.cpu or [0.0]
        return {
            f"{prefix}_longest_turn_ms": max(self.first.wall[0], *wall) * 1e3,
            f"{prefix}_longest_turn_cpu_ms": max(self.first.cpu[0], *cpu) * 1e3,
            f"{prefix}_turn_ms": self.first.wall[0] * 1e3,
            f"{prefix}_turn_cpu_ms": self.first.cpu[0] * 1e3,
            f"{prefix}_sweep_longest_step_ms": max(wall) * 1e3,
            f"{prefix}_sweep_longest_step_cpu_ms": max(cpu) * 1e3,
            f"{prefix}_sweep_steps": len(self.steps.wall),
            f"{prefix}_sweep_total_ms": sum(self.steps.wall) * 1e3,
        }


def loop_turns(change: Callable[[], Any], index: PrefixIndex) -> tuple[Any, Turns]:
    """Run `change` on `index` as one turn, then sweep step by step until done; its result
    and the turns' times."""
    turns = Turns()
    result = turns.first.time(change)
    while turns.steps.time(index.sweep):
        pass
    return result, turns


def new_epoch(churned: PrefixIndex, alone: PrefixIndex) -> tuple[str, Turns]:
    """One live source restarts (a record of a new epoch storing one block) in both
    indexes; its name and its turns in `churned` (the feed's turn: apply and one sweep
    step, then the remaining sweep steps)."""
    info = next(info for info in churned.sources() if info.resident)
    record = Envelope(
        source=Source(instance=info.instance, dp_rank=info.dp_rank, model="m"),
        epoch=info.epoch + 1_000_003,
        seq=0,
        ts=1.8e9,
        body=KVEventBatch(ts=0, events=[BlockStored(block_hashes=[12345], block_size=16)]),
    )
    alone.apply(record)
    _, turns = loop_turns(lambda: churned.apply(record), churned)
    return info.instance, turns


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
    scores = score_latency(index.score, chains, 5000, seed)
    figures = {
        "index": kind,
        "sources": sources,
        "entries": entries,
        "fill_events_per_cpu_s": fill_rate,
        "churn_events_per_cpu_s": churn_rate,
        "rss_bytes_per_entry": grown / entries,
        **scores,
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
    parser.add_argument("--score-while-churning", action="store_true")
    parser.add_argument("--churn-batch", type=int, default=100)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fleet-sources", type=int, default=0)
    parser.add_argument("--idle-resident", type=int, default=2000)
    parser.add_argument(
        "--only-kvscope", action="store_true", help="skip the naive baseline and the 3.2M rows"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    host = f"{platform.node()}, {platform.machine()}, {os.cpu_count()} cpus"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# index_scale {when} on {host}, python {platform.python_version()}")
    print(f"load average {os.getloadavg()}", flush=True)
    if args.only_kvscope:
        print(json(measure("kvscope", args.sources, args.resident, args.churn_records, args.seed)))
    else:
        compare(args.sources, args.resident, args.baseline_resident, args.churn_records, args.seed)
    if args.score_while_churning:
        print(
            json(
                score_while_churning(
                    args.sources,
                    args.resident,
                    args.churn_records,
                    args.churn_batch,
                    args.clients,
                    args.seed,
                )
            )
        )
    if args.fleet_sources:
        print(
            json(
                idle_fleet(
                    args.sources,
                    args.resident,
                    args.fleet_sources,
                    args.idle_resident,
                    args.churn_records,
                    args.seed,
                )
            )
        )
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.cold_start:
        print(json(cold_start(args.sources, args.resident, args.churn_records, args.seed)))


def json(figures: dict[str, Any] | list[dict[str, Any]]) -> str:
    """Figures as indented JSON, with the load average when they were printed."""
    if isinstance(figures, dict):
        figures = {**figures, "load_average": os.getloadavg()}
    return msgspec.json.format(msgspec.json.encode(figures)).decode()


def compare(sources: int, resident: int, baseline_resident: int, churn: int, seed: int) -> None:
    """The naive baseline and kvscope at its size, then kvscope at `resident`, printed."""
    rows = [
        measure("naive", sources, baseline_resident, churn, seed),
        measure("kvscope", sources, baseline_resident, churn, seed),
        measure("kvscope", sources, resident, churn, seed),
    ]
    print(json(rows))
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


if __name__ == "__main__":
    main()

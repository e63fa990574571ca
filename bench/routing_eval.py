"""Routing policies compared on a generated Mooncake-format trace: what exact routing buys.

Writes a trace of multi-turn chats over a few shared system prompts (fixed seed; Mooncake's
JSON lines, one hash id per 16 tokens) and replays it through the fleet simulator with
every policy at fleet KV caches of 50/100/150% of the trace's reusable working set
(distinct prompt blocks two or more requests use): `approximate` with 1 and 4 router
replicas assuming the Gateway API inference extension's 31,250 blocks per engine, and once
told the true size; `exact-index` at index lags of 0/1/5 simulated seconds. Per run: the
fleet hit rate (prompt tokens served from cache), prefill tokens saved, and a TTFT proxy
(queueing in the simulator plus the uncached prompt tokens at `--prefill-tps`), against
round-robin in the same run. Prints Markdown tables for docs/benchmarks.md. Not a timing
benchmark: the figures do not depend on the machine.

    python bench/routing_eval.py [--conversations 500] [--instances 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvscope.cachemodel.blockpool import chain_hashes
from kvscope.schemas import RequestFinished, Source
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances, workload_requests
from kvscope.simulator.trace import write_trace
from kvscope.simulator.workloads import VOCAB, SimRequest

TRACE_BLOCK = 16
"""Tokens per hash id of the generated trace (one engine block)."""
SHARES = (0.5, 1.0, 1.5)
REPLICAS = (1, 4)
LAGS = (0.0, 1.0, 5.0)


def chats(conversations: int, seed: int, rate: float) -> list[SimRequest]:
    """Multi-turn chats: each starts with one of 8 system prompts (Zipf popularity, 1,024
    tokens), runs 1-8 turns re-sending its history, thinks 2-40 s between turns."""
    rng = random.Random(f"routing-eval/{seed}")
    systems = [[rng.randrange(VOCAB) for _ in range(1024)] for _ in range(8)]
    weights = [1 / (k + 1) for k in range(len(systems))]
    out: list[SimRequest] = []
    start = 0.0
    for c in range(conversations):
        start += rng.expovariate(rate)
        history = list(rng.choices(systems, weights)[0])
        t = start
        for turn in range(rng.randint(1, 8)):
            prompt = history + [rng.randrange(VOCAB) for _ in range(rng.randint(32, 256))]
            output = [rng.randrange(VOCAB) for _ in range(rng.randint(32, 256))]
            out.append(SimRequest(f"chat-{c}-{turn}", t, prompt, output))
            history = prompt + output
            t += rng.uniform(2.0, 40.0)
    out.sort(key=lambda r: r.arrival_s)
    return out


def reusable_blocks(requests: list[SimRequest], block_size: int) -> int:
    """Distinct full prompt blocks two or more requests use (the rest can never hit)."""
    uses = Counter(h for r in requests for h in set(chain_hashes(r.prompt, block_size)))
    return sum(1 for n in uses.values() if n >= 2)


@dataclasses.dataclass
class Result:
    """One simulated run's figures."""

    hit_rate: float
    saved_tokens: int
    ttft_mean_s: float
    ttft_p90_s: float
    chose_best: float


def simulate(config: SimConfig, prefill_tps: float) -> Result:
    """Run `config`; the TTFT proxy is queueing plus uncached prompt tokens / `prefill_tps`."""
    ttft: list[float] = []

    def sink(source: Source, epoch: int, body: Any, ts: float) -> None:
        if isinstance(body, RequestFinished):
            ttft.append(body.queue_s + (body.prompt_tokens - body.cached_tokens) / prefill_tps)

    truth = Fleet(config, sink).run()
    fleet = truth["fleet"]
    return Result(
        hit_rate=fleet["hit_rate"],
        saved_tokens=fleet["prefix_hits"],
        ttft_mean_s=statistics.fmean(ttft),
        ttft_p90_s=statistics.quantiles(ttft, n=10)[-1],
        chose_best=truth["routing"]["chose_best_share"],
    )


def policies(capacity: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, SimConfig overrides) of every policy run at one cache size (`capacity`
    blocks per instance): approximate assumes the GIE's 31,250 blocks, or knows `capacity`."""
    runs: list[tuple[str, dict[str, Any]]] = [("round-robin", {"routing": "round-robin"})]
    for n in REPLICAS:
        runs.append((f"approximate ×{n}", {"routing": "approximate", "router_replicas": n}))
    known = {"routing": "approximate", "assumed_capacity_blocks": capacity}
    runs.append(("approximate ×1, size known", known))
    for lag in LAGS:
        runs.append((f"exact-index {lag:g} s", {"routing": "exact-index", "index_lag_s": lag}))
    runs.append(("oracle", {"routing": "oracle"}))
    return runs


def main() -> None:
    """Generate the trace, run every policy at every cache size, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=500, help="default: %(default)s")
    parser.add_argument("--instances", type=int, default=4, help="default: %(default)s")
    parser.add_argument("--rate", type=float, default=2.0, help="chats started per second")
    parser.add_argument("--seed", type=int, default=1, help="default: %(default)s")
    parser.add_argument(
        "--prefill-tps", type=float, default=8000.0, help="prefill tokens/s (TTFT proxy)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "chats.jsonl"
        write_trace(trace, chats(args.conversations, args.seed, args.rate), TRACE_BLOCK)
        base = SimConfig(
            instances=parse_instances(str(args.instances)),
            workload="trace",
            trace=str(trace),
            trace_block_tokens=TRACE_BLOCK,
            requests=10**9,
            seed=args.seed,
            capacity_blocks=1_000_000,
        )
        requests = workload_requests(base)
        base.requests = len(requests)
        reusable = reusable_blocks(requests, base.block_size)
        largest = max(
            math.ceil((len(r.prompt) + len(r.output)) / base.block_size) for r in requests
        )
        print(
            f"Measured {dt.date.today()}: {len(requests)} requests ({args.conversations} chats, "
            f"{sum(len(r.prompt) for r in requests):,} prompt tokens), {args.instances} "
            f"instances, reusable working set {reusable:,} blocks of {base.block_size}.\n"
        )
        results: dict[tuple[float, str], Result] = {}
        started = time.monotonic()
        for share in SHARES:
            per_instance = max(math.ceil(share * reusable / args.instances), 2 * largest)
            for label, overrides in policies(per_instance):
                config = dataclasses.replace(base, capacity_blocks=per_instance, **overrides)
                results[(share, label)] = simulate(config, args.prefill_tps)
        print_tables(results, [label for label, _ in policies(0)])
        print(f"\n{len(results)} runs in {time.monotonic() - started:.0f} s")


def print_tables(results: dict[tuple[float, str], Result], labels: list[str]) -> None:
    """The hit rates per cache size and router replicas with the exact-vs-approximate gap,
    then every run's savings and TTFT proxy against round-robin."""
    lags = [f"exact-index {lag:g} s" for lag in LAGS]
    print("Fleet hit rate (prompt tokens from cache); router replicas matter to approximate")
    print("only (the others share one view), gap = exact-index at lag 0 − approximate:\n")
    print("| cache / working set | replicas | round-robin | approximate | ", end="")
    print(" | ".join(lags) + " | oracle | gap (points) |")
    print("|---:|---:|" + "---:|" * (len(lags) + 4))
    for share in SHARES:
        for n in REPLICAS:
            columns = ("round-robin", f"approximate ×{n}", *lags, "oracle")
            rates = [results[(share, label)].hit_rate for label in columns]
            gap = 100 * (rates[2] - rates[1])
            cells = " | ".join(f"{rate:.3f}" for rate in rates)
            print(f"| {share:.0%} | {n} | {cells} | {gap:+.2f} |")
    print("\nPer run: hit rate, prefill tokens saved, TTFT proxy (mean, p90), and decisions whose")
    print("engine held the longest prefix of all; × RR = ratio to round-robin, same cache size:\n")
    print(
        "| cache | policy | hit rate | tokens saved | × RR | TTFT mean | × RR | "
        "TTFT p90 | × RR | best |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for share in SHARES:
        rr = results[(share, "round-robin")]
        for label in labels:
            r = results[(share, label)]
            print(
                f"| {share:.0%} | {label} | {r.hit_rate:.3f} | {r.saved_tokens:,} | "
                f"{r.saved_tokens / rr.saved_tokens:.2f} | {r.ttft_mean_s:.3f} s | "
                f"{r.ttft_mean_s / rr.ttft_mean_s:.2f} | {r.ttft_p90_s:.3f} s | "
                f"{r.ttft_p90_s / rr.ttft_p90_s:.2f} | {r.chose_best:.1%} |"
            )


if __name__ == "__main__":
    main()

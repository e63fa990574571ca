"""Routing real vLLM engines by kvscope's index against round-robin, on the same requests.

Three `vllm serve` engines of the tiny random Llama (tests/support/tinyllama.py; prefix
caching, 12 blocks of 32 tokens each, kvscope's plugin publishing to a local broker),
`kvscope index` on that broker and `kvscope route --index` in front of the engines. The
workload: multi-turn chats whose turns grow their conversation's prefix by a block each,
conversations sharing a system prompt in groups, turns of all chats interleaved in a seeded
random order (each chat's turns in order). The same requests run three ways, each on its
own token alphabet shift so no mode reuses another's blocks:

- `exact-index`: through `kvscope route` asking the index (affinity 0.8, its default);
- `exact-index, in process`: the same, the router holding the index itself
  (`--index-bootstrap-servers`: no round trip per request);
- `least-load`: through `kvscope route` without an index (least in flight, ties in turn);
- `round-robin`: straight to the engines in turn.

Hit rate as vLLM itself counts it: sum of `usage.prompt_tokens_details.cached_tokens` over
sum of prompt tokens. Routing overhead: the router's `Server-Timing: kvscope-route` per request.
Decisions by basis: `kvscope_route_decisions_total` deltas from the router's /metrics (`index`:
scored by the index; `index_timeout`: the index budget, 20 ms, ran out and load chose; ...).

    python bench/route_real.py [--chats 12] [--turns 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from route_bench import decisions

REPO = Path(__file__).resolve().parents[1]
BLOCK = 32
VOCAB = 500
HASH_SEED = "0"


def workload(chats: int, turns: int, seed: int) -> list[tuple[int, list[int]]]:
    """(chat, prompt token ids) in arrival order: chat c's turn t is its system prompt (2
    blocks, shared by chats of the same group of 3) + its own history (t + 1 blocks)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(10, VOCAB) for _ in range(2 * BLOCK)] for _ in range(chats // 3 + 1)]
    histories = [[rng.randrange(10, VOCAB) for _ in range(turns * BLOCK)] for _ in range(chats)]
    pending = {c: 0 for c in range(chats)}
    order: list[tuple[int, list[int]]] = []
    while pending:
        chat = rng.choice(sorted(pending))
        turn = pending[chat]
        prompt = systems[chat // 3] + histories[chat][: (turn + 1) * BLOCK] + [7] * 5
        order.append((chat, prompt))
        pending[chat] += 1
        if pending[chat] == turns:
            del pending[chat]
    return order


def shifted(prompt: list[int], shift: int) -> list[int]:
    """The prompt in another token alphabet: same structure, blocks no other mode stored."""
    return [10 + (token - 10 + shift) % (VOCAB - 10) for token in prompt]


def basis_counts(urls: list[str]) -> dict[str, float]:
    """kvscope route's decisions so far by basis, summed over `urls` (engines count none)."""
    counts: dict[str, float] = {}
    for url in urls:
        for basis, count in decisions(url).items():
            counts[basis] = counts.get(basis, 0.0) + count
    return counts


def run_mode(urls: list[str], requests: list[tuple[int, list[int]]], served: str) -> dict[str, Any]:
    """Send the requests one after the other (URLs taken in turn); vLLM's hit counts."""
    import httpx

    before = basis_counts(urls)
    prompt_tokens = cached = 0
    overhead_ms: list[float] = []
    chosen: dict[str, int] = {}
    with httpx.Client(timeout=120) as client:
        for n, (_, prompt) in enumerate(requests):
            url = urls[n % len(urls)]
            body = {"model": served, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            answer = client.post(f"{url}/v1/completions", json=body)
            answer.raise_for_status()
            usage = answer.json()["usage"]
            prompt_tokens += int(usage["prompt_tokens"])
            cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            timing = re.search(
                r"kvscope-route;dur=([0-9.]+)", answer.headers.get("server-timing", "")
            )
            if timing:
                overhead_ms.append(float(timing.group(1)))
            engine = answer.headers.get("x-kvscope-engine", url)
            chosen[engine] = chosen.get(engine, 0) + 1
    overhead_ms.sort()
    after = basis_counts(urls)
    result: dict[str, Any] = {
        "requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
        "per_engine": chosen,
    }
    basis = {k: int(v - before.get(k, 0.0)) for k, v in after.items() if v > before.get(k, 0.0)}
    if basis:
        result["basis"] = basis
    if overhead_ms:
        result["overhead_ms_p50"] = overhead_ms[len(overhead_ms) // 2]
        result["overhead_ms_p99"] = overhead_ms[
            min(len(overhead_ms) - 1, int(len(overhead_ms) * 0.99))
        ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.route_fleet import SERVED, engines, kvscope_service, router
    from support.tinyllama import build_tiny_llama

    requests = workload(args.chats, args.turns, args.seed)
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        work = Path(tmp)
        model = build_tiny_llama(work / "model")
        prefix = "bench."
        env = {
            "KVSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "KVSCOPE_TOPIC_PREFIX": prefix,
            "KVSCOPE_INSTANCE": "e{i}",
            "PYTHONHASHSEED": HASH_SEED,
        }
        results: dict[str, Any] = {}
        with engines(model, work, 3, env, "--enable-prompt-tokens-details") as urls:
            spec = ",".join(f"e{i}={url}" for i, url in enumerate(urls))
            index_args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic-prefix", prefix,
                          "--hash-seed", HASH_SEED]  # fmt: skip
            with kvscope_service("index", *index_args, work=work, ready_s=120) as index:
                warm = shifted(requests[0][1], 400)  # the topic exists and the index reads it
                with router("--engines", spec, "--index", index, work=work) as url:
                    run_mode([url], [(0, warm)], SERVED)
                    time.sleep(12)
                    results["exact-index"] = run_mode(
                        [url], [(c, shifted(p, 0)) for c, p in requests], SERVED
                    )
            embedded = ["--index-bootstrap-servers", broker.bootstrap_servers,
                        "--topic-prefix", prefix, "--hash-seed", HASH_SEED]  # fmt: skip
            with kvscope_service("route", "--engines", spec, *embedded, work=work,
                                 ready_s=120) as url:  # fmt: skip
                run_mode([url], [(0, shifted(requests[0][1], 450))], SERVED)
                time.sleep(2)
                results["exact-index, in process"] = run_mode(
                    [url], [(c, shifted(p, 196)) for c, p in requests], SERVED
                )
            with router("--engines", spec, work=work) as url:
                results["least-load"] = run_mode(
                    [url], [(c, shifted(p, 131)) for c, p in requests], SERVED
                )
            results["round-robin"] = run_mode(
                urls, [(c, shifted(p, 262)) for c, p in requests], SERVED
            )
    machine = f"{platform.machine()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}"
    print(f"# route_real {started:%Y-%m-%d %H:%M} UTC on {machine}")
    print(f"# {args.chats} chats x {args.turns} turns, seed {args.seed}, 3 engines x 12 blocks")
    print(json.dumps(results, indent=1))
    base = results["round-robin"]["hit_rate"]
    for mode, row in results.items():
        line = (
            f"{mode}: hit rate {row['hit_rate']:.3f} ({row['hit_rate'] - base:+.3f} vs round-robin)"
        )
        if "overhead_ms_p50" in row:
            p50, p99 = row["overhead_ms_p50"], row["overhead_ms_p99"]
            line += f", routing overhead p50 {p50:.2f} ms p99 {p99:.2f} ms"
        if "basis" in row:
            line += f", decisions by basis {row['basis']}"
        print(line)


if __name__ == "__main__":
    main()

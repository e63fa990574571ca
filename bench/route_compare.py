"""`kvscope route` against the routers users already run, on the same engines and requests.

Three `vllm serve` engines of the tiny random Llama (tests/support/tinyllama.py; prefix
caching, 12 blocks of 32 tokens each), kvscope's plugin on by its one switch,
`--kv-events-config '{"publisher": "kvscope", "endpoint": "kafka://BROKER?...&zmq=tcp://*:P"}'`,
which keeps vLLM's own ZMQ events for vllm-router's `kv_aware`. The routers, one at a time:

- `direct`: every request straight to engine e0 (the latency baseline);
- `pass-through`: bench/passthrough.py, a bare httpx proxy taking the engines in turn with
  `kvscope route`'s HTTP client settings and server (the CPU baseline);
- `kvscope (index in process)`: `kvscope route --index-bootstrap-servers`;
- `kvscope (index over HTTP)`: `kvscope route --index URL` and `kvscope index`;
- `vllm-router` (0.1.17, Rust) with `round_robin`, `cache_aware` and `kv_aware` (the latter
  subscribed to every engine's ZMQ events, `--kv-event-source`, block size 32);
- `sglang-router` (0.3.2, Rust) with `cache_aware`.

For each: the router starts, one warm-up request (its own tokens) goes through it, the
kvscope ones wait until their /healthz says the index is ready, then every engine's prefix
cache is emptied (`POST /reset_prefix_cache`, `VLLM_SERVER_DEV_MODE=1`), so every router
starts from cold caches. Then:

1. the trace: route_real.py's multi-turn chats sharing system prompts (the same requests,
   same order, for every router), sent one after the other as text prompts, one word per
   token id (sglang-router answers 422 to prompts given as token ids; each word is one
   token of the tiny tokenizer, so the prefixes are shared as the ids were); kvscope
   route tokenizes them with the model's tokenizer in process (`--tokenizer`), vllm-router
   with `VLLM_ROUTER_TOKENIZER`. Hit rate: prefix-cache hits
   over queries from the engines' `vllm:prefix_cache_*_total` deltas (vLLM's own count,
   whatever the router does to the answers). CPU per request: user + system time of the
   router's process tree from /proc over the trace, divided by its requests (for the
   HTTP mode `kvscope index`'s process reported apart); and the router's idle CPU rate
   over 5 s before the trace, so the per-request cost can be told apart from background
   work (health checks, the index's feed) that costs the same with no requests at all.
   For kvscope route, the `basis` counts of its decisions (`kvscope_route_decisions_total`;
   `index_timeout` = the 20 ms budget ran out) and its own `Server-Timing` overhead;
2. added latency: `--pairs` pairs of 1-token completions of never-seen prompts (random
   words, 40..200), each pair the same prompt except its first word (so neither side
   finds the other's blocks), one through the router then one straight to engine e0;
   added latency per pair = routed minus direct, client side, p50/p99 over the pairs.

The machine's load average is printed with each router's row: on a shared machine,
compare routers within one run only.

`--baseline-python PY` runs the kvscope rows again with another install's kvscope (the
previous commit's, in its own venv): before and after a change, in one run.

    python bench/route_compare.py [--chats 30] [--turns 4] [--pairs 200] [--only NAME,...]
        [--baseline-python /path/to/other/venv/bin/python]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from route_bench import (
    child,
    cpu_seconds,
    decisions,
    prefix_cache_counts,
    reset_prefix_caches,
    served,
    tree,
)
from route_overhead import WORDS
from route_real import HASH_SEED, shifted, workload

REPO = Path(__file__).resolve().parents[1]
PREFIX = "bench."
IDLE_S = 5
"""Seconds the router's idle CPU is measured for, before the trace (after the reset)."""


@dataclass
class Fleet:
    """What a router is started against."""

    engines: list[str]
    zmq: list[str]
    broker: str
    model: Path
    work: Path
    python: str = sys.executable
    """The Python whose kvscope runs `kvscope route` and `kvscope index`."""


@dataclass
class Started:
    """A running router: its URL, the pids whose CPU counts as its own, and `extra` pids
    reported apart (`kvscope index` for the HTTP mode)."""

    url: str
    pids: list[int]
    extra: list[int]
    kvscope: bool = False


Starter = Callable[[Fleet], Any]


def kvscope_argv(fleet: Fleet, command: str, *args: str) -> list[str]:
    """`kvscope COMMAND ARGS` at warning level (as an operator would run it in production)."""
    return [fleet.python, "-m", "kvscope.cli", "--log-level", "WARNING", command, *args]


def engine_spec(fleet: Fleet) -> str:
    """`--engines` of kvscope route."""
    return ",".join(f"e{i}={url}" for i, url in enumerate(fleet.engines))


@contextmanager
def started(argv: list[str], fleet: Fleet, health: str, **env: str) -> Iterator[Started]:
    """`argv --port P` as the router under test."""
    port = str(free_port())
    url = f"http://127.0.0.1:{port}"
    log = fleet.work / f"router-{port}.log"
    with child([*argv, "--port", port], log, url + health, env) as process:
        yield Started(url, tree(process.pid), [])


@contextmanager
def direct(fleet: Fleet) -> Iterator[Started]:
    """No router: engine e0 itself."""
    yield Started(fleet.engines[0], [], [])


@contextmanager
def passthrough(fleet: Fleet) -> Iterator[Started]:
    """bench/passthrough.py in front of the engines."""
    argv = [sys.executable, str(REPO / "bench" / "passthrough.py"), "--engines",
            ",".join(fleet.engines)]  # fmt: skip
    with started(argv, fleet, "/health") as router:
        yield router


@contextmanager
def kvscope_in_process(fleet: Fleet) -> Iterator[Started]:
    """kvscope route holding the index itself."""
    index = ["--index-bootstrap-servers", fleet.broker, "--topic-prefix", PREFIX,
             "--hash-seed", HASH_SEED]  # fmt: skip
    argv = kvscope_argv(fleet, "route", "--engines", engine_spec(fleet), *index,
                        "--tokenizer", str(fleet.model))  # fmt: skip
    with started(argv, fleet, "/healthz") as router:
        yield Started(router.url, router.pids, [], kvscope=True)


@contextmanager
def kvscope_over_http(fleet: Fleet) -> Iterator[Started]:
    """kvscope route asking `kvscope index` (its own process, started first)."""
    argv = kvscope_argv(fleet, "index", "--bootstrap-servers", fleet.broker,
                        "--topic-prefix", PREFIX, "--hash-seed", HASH_SEED)  # fmt: skip
    with started(argv, fleet, "/healthz") as index:
        route = kvscope_argv(fleet, "route", "--engines", engine_spec(fleet), "--index",
                             index.url, "--tokenizer", str(fleet.model))  # fmt: skip
        with started(route, fleet, "/healthz") as router:
            yield Started(router.url, router.pids, index.pids, kvscope=True)


def vllm_router(policy: str) -> Starter:
    """vllm-router with `policy` (kv_aware: subscribed to the engines' ZMQ events)."""

    @contextmanager
    def start(fleet: Fleet) -> Iterator[Started]:
        argv = ["vllm-router", "--host", "127.0.0.1", "--policy", policy, "--log-level",
                "warning", "--worker-startup-check-interval", "1", "--worker-urls",
                *fleet.engines]  # fmt: skip
        if policy == "kv_aware":
            for engine, zmq in zip(fleet.engines, fleet.zmq, strict=True):
                argv += ["--kv-event-source", f"{engine}={zmq}"]
            argv += ["--kv-event-block-size", "32", "--kv-event-model", "tiny"]
        with started(argv, fleet, "/health", VLLM_ROUTER_TOKENIZER=str(fleet.model)) as router:
            yield router

    return start


@contextmanager
def sglang_router(fleet: Fleet) -> Iterator[Started]:
    """sglang-router with its `cache_aware` policy."""
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--policy", "cache_aware", "--log-level", "warn", "--worker-urls",
            *fleet.engines]  # fmt: skip
    with started(argv, fleet, "/health") as router:
        yield router


ROUTERS: dict[str, Starter] = {
    "direct": direct,
    "pass-through": passthrough,
    "kvscope (index in process)": kvscope_in_process,
    "kvscope (index over HTTP)": kvscope_over_http,
    "vllm-router round_robin": vllm_router("round_robin"),
    "vllm-router cache_aware": vllm_router("cache_aware"),
    "vllm-router kv_aware": vllm_router("kv_aware"),
    "sglang-router cache_aware": sglang_router,
}


def free_port() -> int:
    """A free loopback port."""
    from kvscope.local.broker import free_port as free

    return free()


def text(prompt: list[int]) -> str:
    """A trace prompt as text: a word per token id (each of these words is one token of the
    tiny model's tokenizer), so turns share their text prefixes as they shared ids, and
    text-matching routers (cache_aware) see the same structure as the token-level ones."""
    return " ".join(WORDS[token % len(WORDS)] for token in prompt)


def complete(client: httpx.Client, url: str, prompt: str) -> httpx.Response:
    """A 1-token completion of `prompt` at `url`."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    answer = client.post(f"{url}/v1/completions", json=body)
    answer.raise_for_status()
    return answer


def first_answer(client: httpx.Client, url: str, prompt: str) -> None:
    """The first completion through a router, retried for a minute while it answers 503
    (sglang-router's /health answers before it has taken its workers on)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            complete(client, url, prompt)
            return
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(1)


def wait_index_ready(client: httpx.Client, url: str) -> str:
    """Until a kvscope router's /healthz says its index is ready (at most 3 minutes: then
    the router routes by load, and its basis counts say so); the index's last state."""
    deadline = time.monotonic() + 180
    while True:
        index = client.get(f"{url}/healthz").json().get("index", {})
        if index.get("state") == "ok" or time.monotonic() > deadline:
            return json.dumps(index)
        time.sleep(0.5)


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def trace(client: httpx.Client, router: Started, engines: list[str],
          requests: list[str]) -> dict[str, Any]:  # fmt: skip
    """Run the trace through `router`: hit rate, CPU per request (and the trace's seconds,
    to take out what the router spends idle), kvscope's basis counts."""
    kvscope = router.kvscope
    basis_before = decisions(router.url) if kvscope else {}
    hits_before, queries_before = prefix_cache_counts(engines)
    served_before = served(engines)
    cpu_before, extra_before = cpu_seconds(router.pids), cpu_seconds(router.extra)
    began = time.perf_counter()
    own_ms: list[float] = []
    for prompt in requests:
        answer = complete(client, router.url, prompt)
        timing = re.search(r"kvscope-route;dur=([0-9.]+)", answer.headers.get("server-timing", ""))
        if timing:
            own_ms.append(float(timing.group(1)))
    cpu, extra = cpu_seconds(router.pids) - cpu_before, cpu_seconds(router.extra) - extra_before
    seconds = time.perf_counter() - began
    time.sleep(1)  # the engines' stat loggers publish their counters
    hits, queries = prefix_cache_counts(engines)
    result: dict[str, Any] = {
        "requests": len(requests),
        "hit_rate": (hits - hits_before) / max(1.0, queries - queries_before),
        "seconds": seconds,
        "per_engine": [a - b for a, b in zip(served(engines), served_before, strict=True)],
        "cpu_ms_per_request": 1000 * cpu / len(requests),
    }
    if router.extra:
        result["index_cpu_ms_per_request"] = 1000 * extra / len(requests)
    if kvscope:
        after = decisions(router.url)
        result["basis"] = {k: int(v - basis_before.get(k, 0)) for k, v in after.items()
                           if v - basis_before.get(k, 0)}  # fmt: skip
    if own_ms:
        result["server_timing_ms_p50"] = percentile(own_ms, 0.5)
        result["server_timing_ms_p99"] = percentile(own_ms, 0.99)
    return result


def added_latency(client: httpx.Client, router: str, engine: str, pairs: int) -> dict[str, float]:
    """Routed minus direct latency per pair of never-seen prompts, p50 / p99 in ms."""
    rng = random.Random(7)
    added: list[float] = []
    for n in range(pairs):
        body = " ".join(rng.choice(WORDS) for _ in range(40 + (n * 37) % 160))
        times = []
        for first, url in (("river", router), ("ocean", engine)):
            mark = time.perf_counter()
            complete(client, url, f"{first} {body}")
            times.append(time.perf_counter() - mark)
        added.append(1000 * (times[0] - times[1]))
    return {"added_ms_p50": percentile(added, 0.5), "added_ms_p99": percentile(added, 0.99)}


def measure(
    name: str, fleet: Fleet, requests: list[str], warm: list[str], pairs: int
) -> dict[str, Any]:
    """One router's row: started, warmed, caches reset, its idle CPU, the trace, then the
    latency pairs."""
    with ROUTERS[name](fleet) as router, httpx.Client(timeout=120) as client:
        row: dict[str, Any] = {}
        first_answer(client, router.url, warm[0])
        if router.kvscope:
            row["index_before_trace"] = wait_index_ready(client, router.url)
        complete(client, router.url, warm[1])  # warm with an index too
        reset_prefix_caches(fleet.engines)
        idle = cpu_seconds(router.pids)
        time.sleep(IDLE_S)  # every index hears of the clear
        row["idle_cpu_ms_per_s"] = 1000 * (cpu_seconds(router.pids) - idle) / IDLE_S
        row.update(trace(client, router, fleet.engines, requests))
        if router.pids:
            row.update(added_latency(client, router.url, fleet.engines[0], pairs))
        row["load"] = os.getloadavg()[0]
        return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=30)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--only", default=",".join(ROUTERS), help="routers, comma-separated")
    parser.add_argument(
        "--baseline-python",
        default=None,
        help="also run the kvscope rows with this Python's kvscope (another checkout's "
        "venv, e.g. the previous commit's: before/after in one run), marked [baseline]",
    )
    args = parser.parse_args()
    names = args.only.split(",")
    unknown = set(names) - set(ROUTERS)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; known: {', '.join(ROUTERS)}")
    sys.path.insert(0, str(REPO / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.route_fleet import engines
    from support.tinyllama import build_tiny_llama

    trace_ids = [prompt for _, prompt in workload(args.chats, args.turns, args.seed)]
    requests = [text(prompt) for prompt in trace_ids]
    warm = [text(shifted(prompt, 7)) for prompt in trace_ids[:2]]
    began = datetime.now(UTC)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        broker = stack.enter_context(LocalBroker()).bootstrap_servers
        model = build_tiny_llama(work / "model")
        ports = [free_port() for _ in range(3)]
        events = [{"enable_kv_cache_events": True, "publisher": "kvscope",
                   "endpoint": f"kafka://{broker}?topic_prefix={PREFIX}&zmq=tcp://*:{port}"}
                  for port in ports]  # fmt: skip
        env = {"KVSCOPE_INSTANCE": "e{i}", "PYTHONHASHSEED": HASH_SEED, "VLLM_SERVER_DEV_MODE": "1"}
        urls = stack.enter_context(
            engines(model, work, 3, env, "--enable-prompt-tokens-details", events=events)
        )
        fleet = Fleet(urls, [f"tcp://127.0.0.1:{p}" for p in ports], broker, model, work)
        runs = [(name, fleet) for name in names]
        if args.baseline_python:
            baseline = dataclasses.replace(fleet, python=args.baseline_python)
            runs += [(name, baseline) for name in names if name.startswith("kvscope")]
        for name, where in runs:
            label = name if where is fleet else f"{name} [baseline]"
            try:
                results[label] = measure(name, where, requests, warm, args.pairs)
            except Exception as exc:  # a router that cannot run here is a result too
                results[label] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(label, json.dumps(results[label]), flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cpus"
    print(f"# route_compare {began:%Y-%m-%d %H:%M} UTC on {machine}")
    print(f"# {args.chats} chats x {args.turns} turns, seed {args.seed}, {args.pairs} pairs")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

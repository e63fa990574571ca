"""What `kvscope route` adds per request, against the same requests sent to the engine directly.

Runs on given vLLM engines (`--engines`, their tokenizer `--tokenizer` a local path), or
without `--engines` on its own: two `vllm serve` engines of the tiny test model with
kvscope's plugin, the local broker and `kvscope index`, as route_real.py starts them.
Three measurements, each alternating its two sides request by request:

- tokenize: the text prompts through an engine's `POST /tokenize` (what the router does by
  default) against the same tokenizer in process (`--tokenizer`);
- overhead: the router's time before forwarding (its `Server-Timing` header: parse,
  tokenize, score, choose; and without the tokenize and score stages: the router's own
  part), one `kvscope route` child process per mode: no index (load alone), and with
  `--index`: prompts as token ids, text tokenized by the engine, text tokenized locally;
  and with `--index-bootstrap-servers` the router holding the index itself (token ids,
  local tokenizer);
- end to end: latency of a 1-token completion through the router against straight to an
  engine (ratio of medians).

Usage (engines from `vllm serve`, the index from `kvscope index`, both optional parts):

    python bench/route_overhead.py --engines http://127.0.0.1:8000,http://127.0.0.1:8001 \
        --tokenizer /path/to/model [--index http://127.0.0.1:8200] [--requests 300] \
        [--index-bootstrap-servers 127.0.0.1:9092 --topic-prefix P --hash-seed S]
    python bench/route_overhead.py [--requests 300]     # its own engines, broker and index
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from kvscope.route.tokens import LocalTokenizer

EMBEDDED = "in process"
"""`index` of a mode whose router holds the index itself (`--index-bootstrap-servers`)."""
WORDS = [
    "the",
    "cache",
    "block",
    "token",
    "prefix",
    "hit",
    "miss",
    "evict",
    "store",
    "remove",
    "clear",
    "engine",
    "request",
]


def quantiles(values: list[float]) -> str:
    """p50 / p99 / max in milliseconds."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {statistics.median(ordered):.3f} p99 {p99:.3f} max {ordered[-1]:.3f} ms"


def texts(count: int) -> list[str]:
    """Prompts of 8..120 words (under the tiny engines' 256-token context)."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8 + (i * 7) % 112))
            for i in range(count)]  # fmt: skip


async def tokenize(engine: str, tokenizer: LocalTokenizer, model: str, count: int) -> None:
    """Engine /tokenize against the local tokenizer, alternating."""
    remote: list[float] = []
    local: list[float] = []
    async with httpx.AsyncClient(timeout=30) as client:
        for text in texts(count):
            mark = time.perf_counter()
            answer = await client.post(f"{engine}/tokenize", json={"model": model, "prompt": text})
            remote.append((time.perf_counter() - mark) * 1000)
            mark = time.perf_counter()
            ids = await tokenizer.completion(text, model, True)
            local.append((time.perf_counter() - mark) * 1000)
            assert ids == answer.json()["tokens"], "the local tokenizer is not the engine's"
    print(f"tokenize  engine /tokenize {quantiles(remote)}")
    print(f"tokenize  local            {quantiles(local)}")
    ratio = statistics.median(remote) / statistics.median(local)
    print(f"tokenize  engine/local median ratio {ratio:.1f}x")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def through_router(
    router: str, engine: str, model: str, count: int, text: bool
) -> dict[str, list[float]]:
    """Alternate direct and routed 1-token completions; the router's and end-to-end times."""
    times: dict[str, list[float]] = {"overhead": [], "own": [], "routed": [], "direct": []}
    prompts = texts(count) if text else [list(range(3, 43 + i % 160)) for i in range(count)]
    async with httpx.AsyncClient(timeout=60) as client:
        for prompt in prompts:
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            for side, base in (("direct", engine), ("routed", router)):
                mark = time.perf_counter()
                answer = await client.post(f"{base}/v1/completions", json=body)
                times[side].append((time.perf_counter() - mark) * 1000)
                assert answer.status_code == 200, answer.text
                if side == "routed":
                    stages = dict(
                        (part.split(";dur=")[0].strip(), float(part.split(";dur=")[1]))
                        for part in answer.headers["server-timing"].split(",")
                    )
                    overhead = stages.pop("kvscope-route")
                    times["overhead"].append(overhead)
                    times["own"].append(overhead - sum(stages.values()))
    return times


def start_router(
    args: argparse.Namespace, port: int, tokenizer: str | None, index: str | None
) -> Any:
    command = [sys.executable, "-m", "kvscope.cli", "--log-level", "WARNING", "route",
               "--engines", args.engines, "--port", str(port)]  # fmt: skip
    if index == EMBEDDED:
        command += ["--index-bootstrap-servers", args.index_bootstrap_servers,
                    "--topic-prefix", args.topic_prefix]  # fmt: skip
        command += ["--hash-seed", args.hash_seed] if args.hash_seed else []
    elif index:
        command += ["--index", index]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    cpus = args.router_cpus
    process = subprocess.Popen(
        command, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    sys.exit("kvscope route did not start")


def own_fleet(args: argparse.Namespace, work: Path) -> contextlib.ExitStack:
    """Two tiny engines with kvscope's plugin, the local broker and `kvscope index`, filled
    into `args` (engines, tokenizer, index, index_bootstrap_servers, topic_prefix,
    hash_seed); stopped when the returned stack closes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.route_fleet import SERVED, engines, kvscope_service, with_chat_template
    from support.tinyllama import build_tiny_llama

    stack = contextlib.ExitStack()
    broker = stack.enter_context(LocalBroker())
    model = with_chat_template(build_tiny_llama(work / "base"), work / "model")
    args.model, args.topic_prefix, args.hash_seed = SERVED, "bench.", "0"
    args.index_bootstrap_servers, args.tokenizer = broker.bootstrap_servers, str(model)
    env = {"KVSCOPE_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "KVSCOPE_INSTANCE": "e{i}",
           "KVSCOPE_TOPIC_PREFIX": args.topic_prefix, "PYTHONHASHSEED": args.hash_seed}  # fmt: skip
    urls = stack.enter_context(engines(model, work, 2, env))
    args.engines = ",".join(f"e{i}={url}" for i, url in enumerate(urls))
    index_args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic-prefix",
                  args.topic_prefix, "--hash-seed", args.hash_seed]  # fmt: skip
    args.index = stack.enter_context(kvscope_service("index", *index_args, work=work, ready_s=120))
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=None, help="default: start two tiny engines")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--index", default=None)
    parser.add_argument("--index-bootstrap-servers", default=None)
    parser.add_argument("--topic-prefix", default="kvscope.")
    parser.add_argument("--hash-seed", default=None)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument(
        "--router-cpu",
        type=int,
        default=None,
        help="run the router alone on this CPU, everything else on the others (a router "
        "has its own host or cores in production; vLLM's CPU workers spin on theirs)",
    )
    args = parser.parse_args()
    args.router_cpus = None
    if args.router_cpu is not None:
        others = os.sched_getaffinity(0) - {args.router_cpu}
        if not others or args.router_cpu not in os.sched_getaffinity(0):
            parser.error(f"--router-cpu {args.router_cpu}: needs that CPU and another")
        os.sched_setaffinity(0, others)  # inherited by the engines, the broker and the index
        args.router_cpus = {args.router_cpu}
    with tempfile.TemporaryDirectory() as tmp:
        if args.engines is None:
            with own_fleet(args, Path(tmp)):
                measure(args)
        elif args.tokenizer is None:
            parser.error("--engines needs --tokenizer (their tokenizer, a local path)")
        else:
            measure(args)


def measure(args: argparse.Namespace) -> None:
    """Every measurement the arguments allow, printed as it finishes."""
    engine = args.engines.split(",")[0].split("=")[-1]
    pinned = f", router alone on CPU {args.router_cpu}" if args.router_cpus else ""
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}{pinned}")  # fmt: skip
    asyncio.run(tokenize(engine, LocalTokenizer(args.tokenizer), args.model, args.requests))
    modes = [("no index", False, None, None)]
    if args.index:
        modes += [
            ("ids", False, None, args.index),
            ("text, engine tokenizes", True, None, args.index),
            ("text, local", True, args.tokenizer, args.index),
        ]
    if args.index_bootstrap_servers:
        modes += [
            ("ids, in process", False, None, EMBEDDED),
            ("text, local, in process", True, args.tokenizer, EMBEDDED),
        ]
    for label, text, tokenizer, index in modes:
        port = free_port()
        router = start_router(args, port, tokenizer, index)
        try:
            times = asyncio.run(
                through_router(f"http://127.0.0.1:{port}", engine, args.model, args.requests, text)
            )
        finally:
            router.terminate()
            router.wait()
        ratio = statistics.median(times["routed"]) / statistics.median(times["direct"])
        print(f"route[{label}] overhead {quantiles(times['overhead'])}")
        print(f"route[{label}] without tokenize and score {quantiles(times['own'])}")
        print(f"route[{label}] end to end: routed {quantiles(times['routed'])}")
        print(f"route[{label}] end to end: direct {quantiles(times['direct'])}")
        print(f"route[{label}] routed/direct median ratio {ratio:.3f}")


if __name__ == "__main__":
    main()

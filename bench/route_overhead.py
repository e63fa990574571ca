"""What `kvscope route` adds per request, against the same requests sent to the engine directly.

Needs running vLLM engines (`--engines`) and their tokenizer (`--tokenizer`, a local path).
Three measurements, each alternating its two sides request by request:

- tokenize: the text prompts through an engine's `POST /tokenize` (what the router does by
  default) against the same tokenizer in process (`--tokenizer`);
- overhead: the router's time before forwarding (its `Server-Timing` header: parse,
  tokenize, score, choose; and without the tokenize and score stages: the router's own
  part), one `kvscope route` child process per mode: no index (load alone), and with
  `--index`: prompts as token ids, text tokenized by the engine, text tokenized locally;
- end to end: latency of a 1-token completion through the router against straight to an
  engine (ratio of medians).

Usage (engines from `vllm serve`, the index from `kvscope index`, both optional parts):

    python bench/route_overhead.py --engines http://127.0.0.1:8000,http://127.0.0.1:8001 \
        --tokenizer /path/to/model [--index http://127.0.0.1:8200] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from kvscope.route.tokens import LocalTokenizer

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
    if index:
        command += ["--index", index]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    sys.exit("kvscope route did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--index", default=None)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    engine = args.engines.split(",")[0].split("=")[-1]
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    asyncio.run(tokenize(engine, LocalTokenizer(args.tokenizer), args.model, args.requests))
    modes = [("no index", False, None, None)]
    if args.index:
        modes += [
            ("ids", False, None, args.index),
            ("text, engine tokenizes", True, None, args.index),
            ("text, local", True, args.tokenizer, args.index),
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

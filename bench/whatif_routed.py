"""The capacity what-if for a fleet routed by kvscope's index, checked against re-running it.

Two `vllm serve` engines of the tiny random Llama (tests/support/tinyllama.py; prefix
caching, 32-token blocks, kvscope's plugin publishing KV events, stats and the access
stream to a local broker) behind `kvscope route --index` (with `kvscope index` on the same
broker) replay the generated Mooncake-format trace of bench/whatif_real.py (questions
about 30 documents picked by Zipf popularity) at its timestamps, with
`--num-gpu-blocks-override` = 1x, 1.5x and 2x `--blocks`. The 1x run is stored through the
real collector into chDB, and `capacity_what_if` predicts the fleet hit rate at +50 % and
+100 % (the routed access stream is replayed with re-routing, `access-replay-rerouted`);
the prediction is compared with the hit rate vLLM itself reported (`cached_tokens`) in the
1.5x and 2x runs.

    python bench/whatif_routed.py [--requests 200] [--rate 3] [--blocks 24] [--keep DIR] \
        [--workload zipf|multi-turn] [--seed 3] [--repeats 1]

`--workload multi-turn`: chats of 4 turns re-sending their history (a 64-token system
prompt shared by all, 32-token user turns, 8 output tokens, 2 s think time), instead of
the Zipf questions.

`--repeats N` runs the three sizes N times over the same trace: the real fleet's hit rate
moves from run to run (arrival timing, batching), so the prediction of each 1x run is
compared with each size's mean over the repeats, and the spread of the re-runs (max − min,
points) says how much of an error is the engines' own noise.

With `--keep DIR` the trace, the logs and each 1x run's chDB (databases `routed_x1`,
`routed_x1_r2`, ..., with the accesses) stay in DIR for a closer look at the replay.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from statistics import fmean as mean
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HASH_SEED = "0"


def replay_trace(url: str, served: str, trace: Path) -> float:
    """Send the trace's requests to `url` at their timestamps; vLLM's hit rate."""
    import httpx

    sys.path.insert(0, str(REPO / "tests"))
    from support.trace_engine_proc import prompt_of

    lines = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
    cache: dict[int, list[int]] = {}
    counts = [0, 0]
    lock = threading.Lock()

    prompts = [prompt_of(cache, i, line) for i, line in enumerate(lines)]

    def send(index: int, line: dict[str, Any], client: httpx.Client) -> None:
        n = max(int(line["output_length"]), 1)
        body = {"model": served, "prompt": prompts[index], "max_tokens": n,
                "min_tokens": n, "ignore_eos": True, "temperature": 0}  # fmt: skip
        answer = client.post(f"{url}/v1/completions", json=body)
        answer.raise_for_status()
        usage = answer.json()["usage"]
        details = usage.get("prompt_tokens_details") or {}
        with lock:
            counts[0] += int(usage["prompt_tokens"])
            counts[1] += int(details.get("cached_tokens") or 0)

    threads = []
    with httpx.Client(timeout=300) as client:
        start = time.monotonic()
        for i, line in enumerate(lines):
            wait = line["timestamp"] / 1000 - (time.monotonic() - start)
            if wait > 0:
                time.sleep(wait)
            thread = threading.Thread(target=send, args=(i, line, client))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
    return counts[1] / counts[0] if counts[0] else math.nan


def run(model: Path, trace: Path, work: Path, broker: str, blocks: int, prefix: str) -> float:
    """One routed fleet at `blocks` KV blocks per engine; vLLM's hit rate over the trace."""
    from support.route_fleet import SERVED, engines, kvscope_service, router

    env = {
        "KVSCOPE_BOOTSTRAP_SERVERS": broker,
        "KVSCOPE_TOPIC_PREFIX": prefix,
        "KVSCOPE_INSTANCE": "engine-{i}",
        "PYTHONHASHSEED": HASH_SEED,
    }
    extra = ("--enable-prompt-tokens-details", "--num-gpu-blocks-override", str(blocks))
    with engines(model, work / prefix, 2, env, *extra) as urls:
        spec = ",".join(f"engine-{i}={url}" for i, url in enumerate(urls))
        index_args = ["--bootstrap-servers", broker, "--topic-prefix", prefix,
                      "--hash-seed", HASH_SEED]  # fmt: skip
        with (
            kvscope_service("index", *index_args, work=work, ready_s=120) as index,
            router("--engines", spec, "--index", index, work=work) as url,
        ):
            return replay_trace(url, SERVED, trace)


def make_trace(path: Path, args: argparse.Namespace) -> Path:
    """The trace the fleets replay (`--workload`, `--seed`), one id per 32-token block."""
    from kvscope.simulator.trace import write_trace
    from kvscope.simulator.workloads import generate
    from support.vllm_e2e import zipf_trace

    if args.workload == "zipf":
        return zipf_trace(path, args.requests, args.rate, args.seed)
    knobs = {"turns": 4, "system_prompt_len": 64, "user_len": 32, "output_len": 8, "think_s": 2}
    requests = generate("multi-turn", args.requests, args.seed, args.rate, knobs)
    write_trace(path, requests, block_tokens=32)
    return path


def summarize(
    measured: list[dict[float, float]], predictions: list[dict[float, dict[str, Any]]]
) -> dict[str, Any]:
    """Over the repeats: per larger size the re-runs' mean and spread, and each 1x run's
    prediction with its error against that mean (points)."""
    from whatif_real import MULTIPLIERS

    base = [m[1.0] for m in measured]
    spread = round(100 * (max(base) - min(base)), 2)
    out: dict[str, Any] = {"x1.0": {"mean": round(mean(base), 4), "spread_pp": spread}}
    for multiplier in MULTIPLIERS[1:]:
        runs = [m[multiplier] for m in measured]
        predicted = [p[multiplier - 1.0]["predicted"] for p in predictions]
        average = mean(runs)
        errors = [round(100 * (x - average), 2) for x in predicted]
        out[f"x{multiplier}"] = {
            "mean": round(average, 4),
            "spread_pp": round(100 * (max(runs) - min(runs)), 2),
            "predicted": [round(x, 4) for x in predicted],
            "error_pp_vs_mean": errors,
            "mean_error_pp": round(mean(errors), 2),
        }
    return out


def main() -> None:
    """Run the routed fleet at every size (`--repeats` times), predict from each 1x run,
    print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="trace requests (default 200)")
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s (default 3)")
    parser.add_argument("--blocks", type=int, default=24, help="1x KV blocks (default 24)")
    parser.add_argument("--keep", type=Path, default=None, help="work in DIR and keep it")
    parser.add_argument("--workload", choices=("zipf", "multi-turn"), default="zipf")
    parser.add_argument("--seed", type=int, default=3, help="trace seed (default 3)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (default 1)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "bench"))
    from kvscope.local.broker import LocalBroker
    from support.tinyllama import build_tiny_llama
    from whatif_real import MULTIPLIERS, compare, predict

    started = datetime.now(UTC)
    measured: list[dict[float, float]] = []
    predictions: list[dict[float, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = build_tiny_llama(work / "model")
        trace = make_trace(work / "trace.jsonl", args)
        for repeat in range(1, args.repeats + 1):
            sizes: dict[float, float] = {}
            for multiplier in MULTIPLIERS:
                blocks = round(args.blocks * multiplier)
                prefix = f"routed-{uuid.uuid4().hex[:6]}."
                servers = broker.bootstrap_servers
                sizes[multiplier] = run(model, trace, work, servers, blocks, prefix)
                label = f"run {repeat}/{args.repeats} x{multiplier}"
                print(f"{label}: {sizes[multiplier]:.4f}", file=sys.stderr, flush=True)
                if multiplier == 1.0:
                    suffix = "" if repeat == 1 else f"_r{repeat}"
                    database = f"routed_x1{suffix}" if args.keep else None
                    predictions.append(predict(work / "chdb", servers, prefix, database))
            measured.append(sizes)
    machine = f"{platform.machine()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}"
    print(f"# whatif_routed {started:%Y-%m-%d %H:%M} UTC on {machine}")
    print(f"# {args.workload} seed {args.seed}, {args.requests} requests at {args.rate}/s")
    runs = [
        {"measured_x1": round(m[1.0], 4), "predicted_from_x1": compare(m, p)}
        for m, p in zip(measured, predictions, strict=True)
    ]
    report: dict[str, Any] = runs[0]
    if args.repeats > 1:
        report = {"runs": runs, "over_repeats": summarize(measured, predictions)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""How good is the capacity what-if on real vLLM engines: predicted from a 1x run, measured at
1.5x and 2x the KV blocks.

Real vLLM CPU engines (the tiny random Llama of tests/support/tinyllama.py, prefix caching,
32-token blocks, kvscope's plugin and stat logger on, to a local broker) replay the same
generated Mooncake-format trace (one id per 32-token block: questions about 30 documents
of 4 blocks picked by Zipf popularity, 8 output tokens each) with
`num_gpu_blocks_override` = 1x, 1.5x and 2x `--blocks`, as one engine and as a fleet of
two behind a static split (request i to engine i mod 2). Each run is stored through the
real collector into chDB; from the 1x run `capacity_what_if` predicts the fleet hit rate
at +50 % and +100 % (access replay, and the events-only refault model beside it), which is
compared with the hit rate vLLM itself reported (its num_cached_tokens) in the 1.5x and 2x
runs. Reported per fleet: measured and predicted hit rates, the error in points and the
predicted gain as a share of the measured gain.

    python bench/whatif_real.py [--requests 200] [--rate 3] [--blocks 24]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MULTIPLIERS = (1.0, 1.5, 2.0)
FLEETS = {"one engine": 1, "two engines, static split": 2}


def run_fleet(
    model: Path, trace: Path, workdir: Path, broker: str, engines: int, blocks: int, prefix: str
) -> dict[str, Any]:
    """Run `engines` engine processes on their parts of `trace`; their combined truth."""
    from support.vllm_e2e import run_trace_engine, trace_truth

    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    procs = []
    for part in range(engines):
        part_env = {
            **env,
            "KVSCOPE_BOOTSTRAP_SERVERS": broker,
            "KVSCOPE_TOPIC_PREFIX": prefix,
            "KVSCOPE_INSTANCE": f"engine-{part}",
        }
        procs.append(run_trace_engine(model, trace, workdir, part_env, blocks, f"{part}/{engines}"))
    with ThreadPoolExecutor(len(procs)) as pool:  # read every stdout: none may fill its pipe
        truths = list(pool.map(trace_truth, procs))
    requests = {k: v for t in truths for k, v in t["requests"].items()}
    prompt = sum(r[0] for r in requests.values())
    return {"requests": len(requests), "hit_rate": sum(r[1] for r in requests.values()) / prompt}


def predict(
    chdb: Path, broker: str, prefix: str, database: str | None = None
) -> dict[float, dict[str, float]]:
    """Collect the run's topics into a fresh chDB database (`database`, else a new name);
    the fleet what-if per fraction."""
    import clickhouse_connect
    from kvscope.analytics.queries import run_query
    from support.e2e_support import collect

    database = database or f"bench_{uuid.uuid4().hex[:8]}"
    client = clickhouse_connect.get_client(dsn=f"chdb://{chdb}")
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.database = database
    try:
        collect(client, f"chdb://{chdb}?database={database}", broker, prefix)
        rows = run_query(
            client,
            "capacity_what_if",
            {"since": "1970-01-01", "until": "2100-01-01", "fractions": [0.5, 1.0]},
        )
    finally:
        client.close()
    return {
        float(r["fraction"]): {
            "observed": float(r["hit_rate"]),
            "predicted": float(r["predicted_hit_rate"]),
            "refault": float(r["predicted_hit_rate_corrected"]),
            "method": r["method"],
            "capacity": int(r["capacity_blocks"]),
        }
        for r in rows
        if r["instance"] == "*"
    }


def compare(
    measured: dict[float, float], prediction: dict[float, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per larger size (`x1.5`, `x2.0`): measured and predicted hit rates, the error in
    points and the predicted gain as a share of the measured one (refault model beside)."""
    base = measured[1.0]
    rows = {}
    for multiplier in MULTIPLIERS[1:]:
        p = prediction[multiplier - 1.0]
        real_gain = measured[multiplier] - base
        rows[f"x{multiplier}"] = {
            "measured": round(measured[multiplier], 4),
            "predicted": round(p["predicted"], 4),
            "error_pp": round(100 * (p["predicted"] - measured[multiplier]), 2),
            "gain_ratio": round((p["predicted"] - p["observed"]) / real_gain, 3)
            if real_gain
            else None,
            "refault_predicted": round(p["refault"], 4),
            "refault_error_pp": round(100 * (p["refault"] - measured[multiplier]), 2),
            "method": p["method"],
        }
    return rows


def main() -> None:
    """Run every fleet at every size, predict from 1x, print the comparison as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="trace requests (default 200)")
    parser.add_argument("--rate", type=float, default=3.0, help="requests/s (default 3)")
    parser.add_argument("--blocks", type=int, default=24, help="1x KV blocks (default 24)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from kvscope.local.broker import LocalBroker
    from support.tinyllama import build_tiny_llama
    from support.vllm_e2e import zipf_trace

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalBroker() as broker:
        work = Path(tmp)
        model = build_tiny_llama(work / "model")
        trace = zipf_trace(work / "trace.jsonl", args.requests, args.rate)
        for name, engines in FLEETS.items():
            measured: dict[float, float] = {}
            prediction: dict[float, dict[str, float]] = {}
            for multiplier in MULTIPLIERS:
                blocks = round(args.blocks * multiplier)
                prefix = f"bench-whatif-{uuid.uuid4().hex[:6]}."
                run = run_fleet(
                    model, trace, work, broker.bootstrap_servers, engines, blocks, prefix
                )
                measured[multiplier] = run["hit_rate"]
                if multiplier == 1.0:
                    prediction = predict(work / "chdb", broker.bootstrap_servers, prefix)
                print(f"{name} x{multiplier}: {run}", file=sys.stderr, flush=True)
            base = measured[1.0]
            rows = compare(measured, prediction)
            results[name] = {
                "measured_x1": round(base, 4),
                "observed_x1_engine_stats": round(prediction[0.5]["observed"], 4),
                "capacity_x1": prediction[0.5]["capacity"],
                **rows,
            }
    summary = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "requests": args.requests,
        "rate": args.rate,
        "blocks_x1": args.blocks,
        "fleets": results,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

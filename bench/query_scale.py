"""Time every analytics query over >= 10 million KV block events in embedded chDB.

The data: one simulated fleet (kvscope's simulator, rows built by the collector's own
decode and column code, inserted without Kafka) copied with INSERT ... SELECT onto more
instances until the block-event table holds the target row count. Each copy gets its
own instance names and block-hash salt, so residency, refaults, routing opportunity and
duplication keep the simulator's structure; the per-minute aggregates fill through their
materialized views like in production.

Every query runs twice (the second, warm run is reported) next to a baseline measured in
the same run: a plain aggregate scan of the whole block-event table. Results go to
stdout as a Markdown table (append it to docs/benchmarks.md).

    python bench/query_scale.py [--rows 10000000] [--path DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import shutil
import tempfile
import time
from typing import Any

from kvscope.collector.analytics.queries import list_queries, run_query
from kvscope.collector.storage import tables
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import connect, parse_target
from kvscope.schemas import ConfigError
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from kvscope.simulator.sinks import DirectSink

EVENTS = tables.KV_BLOCK_EVENTS.name
BASELINE = f"SELECT count(), sum(tokens), uniqExact(block_hash) FROM {EVENTS}"
RAW_TABLES = tuple(
    t.name
    for t in (tables.KV_BLOCK_EVENTS, tables.ENGINE_STATS, tables.REQUESTS, tables.KV_TRANSFERS)
)


def seed_fleet(client: Any, requests: int) -> dict:
    """Simulate the benchmarks' fleet (2p,2d,4b, zipf, a reset) straight into `client`."""
    config = SimConfig(
        instances=parse_instances("2p,2d,4b"),
        workload="zipf",
        workload_params={"documents": 3000, "doc_len": 512, "alpha": 0.9},
        routing="random",
        requests=requests,
        rate=200.0,
        capacity_blocks=4000,
        max_running=32,
        seed=1,
        resets=(("engine-0", 60.0),),
        access_stream=False,  # this bench times the SQL; the access replay is Python (whatif.py)
    )
    sink = DirectSink(client, batch=50_000)
    truth = Fleet(config, sink).run()
    sink.close()
    return truth


def _copy(client: Any, copies: int) -> None:
    """Copy every raw table's rows onto `copies` more sets of instances."""
    for table in RAW_TABLES:
        columns = [
            name
            for (name,) in client.query(
                f"SELECT name FROM system.columns WHERE "
                f"database = currentDatabase() AND table = '{table}'"
                " ORDER BY position"
            ).result_rows
        ]
        rename = {
            "instance": "concat(instance, '~', toString(c))",
            "src_instance": "concat(src_instance, '~', toString(c))",
            "dst_instance": "concat(dst_instance, '~', toString(c))",
            "block_hash": "if(block_hash = 0, 0, bitXor(block_hash, cityHash64(c)))",
            "parent_hash": "if(parent_hash = 0, 0, bitXor(parent_hash, cityHash64(c)))",
        }
        select = ", ".join(rename.get(c, c) for c in columns)
        client.command(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table} "
            f"ARRAY JOIN range(1, {copies + 1}) AS c",
            settings={"max_insert_threads": 2},
        )


def _timed(fn: Any) -> tuple[float, Any]:
    fn()
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main() -> None:
    """Build the data set, time the baseline and every query, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="block events at least")
    parser.add_argument("--seed-requests", type=int, default=40_000)
    parser.add_argument(
        "--path", help="chDB directory, kept and reused (default: a temporary one, removed)"
    )
    args = parser.parse_args()
    path = args.path or tempfile.mkdtemp(prefix="kvscope-bench-")
    target = parse_target(f"chdb://{path}?database=bench")
    client = connect(target)
    try:
        migrate(client, target)
        started = time.perf_counter()
        rows = client.command(f"SELECT count() FROM {EVENTS}")
        if rows < args.rows:
            seed_fleet(client, args.seed_requests)
            seed_rows = client.command(f"SELECT count() FROM {EVENTS}")
            _copy(client, max(0, math.ceil(args.rows / seed_rows) - 1))
            for aggregate in tables.AGGREGATES:
                client.command(f"OPTIMIZE TABLE {aggregate.name} FINAL")
            rows = client.command(f"SELECT count() FROM {EVENTS}")
        build_s = time.perf_counter() - started
        sources = client.command(f"SELECT uniqExact(instance, dp_rank) FROM {EVENTS}")
        baseline_s, _ = _timed(lambda: client.query(BASELINE))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}")
        print(f"date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        print(f"{EVENTS} rows: {rows:,} from {sources} sources (built in {build_s:.0f} s)")
        print(f"baseline (count, sum, uniqExact over all rows): {baseline_s:.3f} s\n")
        print("| query | rows out | seconds (warm) | x baseline |")
        print("|---|---:|---:|---:|")
        for q in list_queries():
            try:
                seconds, out = _timed(lambda q=q: run_query(client, q.name))
            except ConfigError as exc:
                print(f"| {q.name} | needs parameters ({exc}) | | |")
                continue
            print(f"| {q.name} | {len(out)} | {seconds:.2f} | {seconds / baseline_s:.1f} |")
    finally:
        client.close()
        if not args.path:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()

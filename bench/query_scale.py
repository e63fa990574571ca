"""Time every analytics query and the report over >= 10 million KV block events in chDB.

The data: one simulated fleet (kvscope's simulator, rows built by the collector's own
decode and column code, inserted without Kafka) copied with INSERT ... SELECT until the
block-event table holds the target row count. Copy c runs as instance group c % groups
(its own instance names) in time slot c // groups (shifted by the seed's span, as a new
epoch: the engines restarted), with its own block-hash salt, so residency, refaults,
routing opportunity and duplication keep the simulator's structure and the history spans
several hours; the per-minute aggregates fill through their materialized views like in
production. Then the materialized residency is derived from scratch (timed).

Every query runs twice (the second, warm run is reported) for the whole table and for
the last hour, next to a baseline measured in the same run: a plain aggregate scan of the
whole block-event table. Results go to stdout as a Markdown table (append it to
docs/benchmarks.md).

    python bench/query_scale.py [--rows 10000000] [--path DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from kvscope.analytics.queries import list_queries, run_query
from kvscope.analytics.report.gather import gather_report
from kvscope.analytics.report.model import ReportParams
from kvscope.collector.pipeline.direct_sink import DirectSink
from kvscope.collector.storage import residency, tables
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import connect, parse_target
from kvscope.schemas import ConfigError
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances

EVENTS = tables.KV_BLOCK_EVENTS.name
BASELINE = f"SELECT count(), sum(tokens), uniqExact(block_hash) FROM {EVENTS}"
SLO_MS = 50.0
"""`slo_ms` for the queries that take one (the report's default SLO)."""
RAW_TABLES = tuple(
    t.name
    for t in (tables.KV_BLOCK_EVENTS, tables.ENGINE_STATS, tables.REQUESTS, tables.KV_TRANSFERS)
)


class _Quiet:
    """A report progress that shows nothing."""

    def step(self, label: str, total: int) -> None:
        """Start a step (ignored)."""

    def advance(self) -> None:
        """One unit done (ignored)."""


def seed_fleet(client: Any, requests: int, rate: float = 200.0) -> dict:
    """Simulate the benchmarks' fleet (2p,2d,4b, zipf, a reset) straight into `client`."""
    config = SimConfig(
        instances=parse_instances("2p,2d,4b"),
        workload="zipf",
        workload_params={"documents": 3000, "doc_len": 512, "alpha": 0.9},
        routing="random",
        requests=requests,
        rate=rate,
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


@contextlib.contextmanager
def fresh_chdb(prefix: str, database: str) -> Iterator[Any]:
    """A client of a fresh temporary chDB database with kvscope's schema; the database is
    removed afterwards."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        target = parse_target(f"chdb://{folder}?database={database}")
        client = connect(target)
        migrate(client, target)
        yield client
        client.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def seeded_chdb(prefix: str, database: str, requests: int) -> Iterator[Any]:
    """A client of a fresh temporary chDB database with kvscope's schema and the
    benchmarks' fleet (`seed_fleet`) in it; the database is removed afterwards."""
    with fresh_chdb(prefix, database) as client:
        seed_fleet(client, requests)
        yield client


def _copy(client: Any, copies: int, groups: int) -> None:
    """Copy every raw table's rows `copies` times: copy c as instance group c % groups in
    time slot c // groups (a new epoch, shifted by the seed's span)."""
    span_us = client.command(
        f"SELECT dateDiff('microsecond', min(ts), max(ts)) + 1000000 FROM {EVENTS}"
    )
    group = f"(c % {int(groups)})"
    shift = f"toIntervalMicrosecond(intDiv(c, {int(groups)}) * {int(span_us)})"
    for table in RAW_TABLES:
        columns = [
            name
            for (name,) in client.query(
                f"SELECT name FROM system.columns WHERE "
                f"database = currentDatabase() AND table = '{table}'"
                " ORDER BY position"
            ).result_rows
        ]
        rename = (
            {
                name: f"if({group} = 0, {name}, concat({name}, '~', toString({group})))"
                for name in ("instance", "src_instance", "dst_instance")
            }
            | {
                name: f"if({name} = 0, 0, bitXor({name}, cityHash64(c)))"
                for name in ("block_hash", "parent_hash")
            }
            | {name: f"{name} + {shift}" for name in ("ts", "start_ts", "end_ts")}
        )
        rename["epoch"] = f"epoch + intDiv(c, {int(groups)})"
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


def _report(client: Any, since: dt.datetime | None, until: dt.datetime | None) -> Any:
    params = ReportParams(since, until, None, 0.7, SLO_MS)
    return gather_report(client, params, _Quiet(), dt.datetime.now(dt.UTC))


def _storage(client: Any) -> list[tuple[str, int, int]]:
    """(column, compressed bytes, uncompressed bytes) of the block-event table's parts."""
    rows = client.query(
        "SELECT column, sum(column_data_compressed_bytes), sum(column_data_uncompressed_bytes) "
        "FROM system.parts_columns WHERE database = currentDatabase() AND table = {t:String} "
        "AND active GROUP BY column ORDER BY 2 DESC",
        parameters={"t": EVENTS},
    ).result_rows
    return [(str(c), int(z), int(u)) for c, z, u in rows]


def main() -> None:
    """Build the data set, time the baseline and every query, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="block events at least")
    parser.add_argument("--seed-requests", type=int, default=40_000)
    parser.add_argument(
        "--seed-rate", type=float, default=10.0, help="requests/s of the seed (default: 10)"
    )
    parser.add_argument(
        "--groups", type=int, default=8, help="instance groups (x 8 sources; default: 8)"
    )
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
            seed_fleet(client, args.seed_requests, args.seed_rate)
            seed_rows = client.command(f"SELECT count() FROM {EVENTS}")
            _copy(client, max(0, math.ceil(args.rows / seed_rows) - 1), args.groups)
            for aggregate in tables.AGGREGATES:
                client.command(f"OPTIMIZE TABLE {aggregate.name} FINAL")
            rows = client.command(f"SELECT count() FROM {EVENTS}")
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        derived = residency.refresh(client)
        derive_s = time.perf_counter() - started
        sources = client.command(f"SELECT uniqExact(instance, dp_rank) FROM {EVENTS}")
        last = client.query(f"SELECT max(ts) FROM {EVENTS}").result_rows[0][0]
        hour = {"since": last - dt.timedelta(hours=1), "until": last + dt.timedelta(seconds=1)}
        baseline_s, _ = _timed(lambda: client.query(BASELINE))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}")
        print(f"date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}")
        print(f"{EVENTS} rows: {rows:,} from {sources} sources (built in {build_s:.0f} s)")
        print(
            f"residency derived: {derived.events:,} events in {derive_s:.0f} s "
            f"({derived.generations} steps); one-hour window: {hour['since']} .. {hour['until']}"
        )
        stored = _storage(client)
        total = sum(z for _, z, _ in stored)
        top = ", ".join(f"{c} {z / rows:.2f}" for c, z, _ in stored[:4])
        print(f"on disk: {total / rows:.2f} compressed bytes per block event ({top}, ...)")
        print(f"baseline (count, sum, uniqExact over all rows): {baseline_s:.3f} s\n")
        print(
            "| query | rows out | seconds (warm) | x baseline "
            "| 1 h rows out | 1 h seconds (warm) | 1 h x baseline |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for q in list_queries():
            cells = []
            for params in ({"slo_ms": SLO_MS}, {"slo_ms": SLO_MS} | hour):
                wanted = {k: v for k, v in params.items() if k in q.params}
                try:
                    seconds, out = _timed(lambda q=q, p=wanted: run_query(client, q.name, p))
                except ConfigError as exc:
                    cells.append(f"needs parameters ({exc}) | |")
                    continue
                cells.append(f"{len(out)} | {seconds:.2f} | {seconds / baseline_s:.1f}")
            print(f"| {q.name} | {' | '.join(cells)} |")
        full_s, _ = _timed(lambda: _report(client, None, None))
        hour_s, _ = _timed(lambda: _report(client, hour["since"], hour["until"]))
        print(
            f"| (whole report) | | {full_s:.2f} | {full_s / baseline_s:.1f} "
            f"| | {hour_s:.2f} | {hour_s / baseline_s:.1f} |"
        )
    finally:
        client.close()
        if not args.path:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()

"""What the residency materialization costs per block event, and what any version of it must.

Issue 16 asks for the collector *with* the materialization at >= 1M block events per
CPU-second: <= 1,000 ns per block event for storing, deriving and writing the derived rows.
This measures, on query_scale's simulated fleet in a fresh embedded chDB database, process
CPU time per block event of:

- storing the raw block events (the baseline): read back as Arrow and inserted into an empty
  copy of `kv_block_events` (same columns, codecs, skip index and projection; its per-minute
  view does not fire there) through `Python(table)` in flushes of `--flush-rows`, the way the
  collector inserts;
- the residency derivation as it runs now (`residency.rebuild`: every generation, its
  staging, publish and commit);
- writing only the rows a derivation produces (the closed intervals, their by-hash copy and
  the open intervals), read back as Arrow and inserted into empty copies of their tables:
  what any derivation that keeps these tables pays before computing anything.

Medians of `--repeat` rounds, each after the previous round's rows are dropped. Results go
to stdout as Markdown (docs/benchmarks/history.md, "The floor of an in-collector materialization").

    python bench/materialization_floor.py [--requests 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage import residency, tables
from kvscope.collector.storage.store import ChdbStore
from query_scale import seeded_chdb  # bench/ is on sys.path when run as a script

EVENTS = tables.KV_BLOCK_EVENTS.name
DERIVED = ("kv_block_intervals", "kv_block_intervals_by_hash", "kv_block_open")
"""The tables a derivation writes for every interval (its bookkeeping tables are small)."""


def _median_cpu(
    rounds: int, work: Callable[[], None], setup: Callable[[], None] | None = None
) -> float:
    """Median CPU seconds of `work` over `rounds`, `setup` (not timed) before each: the
    whole process's CPU time, every thread (chDB runs inside it)."""
    spent = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return statistics.median(spent)


def _time_reinsert(client: Any, table: str, flush_rows: int, rounds: int) -> tuple[float, int]:
    """Median CPU seconds to insert `table`'s rows, read once, into an empty copy of it
    (same engine, codecs, indexes, projections; emptied before each round), flush by
    flush; and the number of rows."""
    rows = client.query_arrow(f"SELECT * FROM {table}")
    copy = f"floor_{table}"
    client.command(f"DROP TABLE IF EXISTS {copy}")
    client.command(f"CREATE TABLE {copy} AS {table}")
    sink = ClickHouseSink(ChdbStore(client))

    def insert() -> None:
        for number, start in enumerate(range(0, rows.num_rows, flush_rows)):
            sink.insert(Insert(copy, rows.slice(start, flush_rows), f"{copy}-{number}"))

    seconds = _median_cpu(rounds, insert, lambda: client.command(f"TRUNCATE TABLE {copy}"))
    return seconds, rows.num_rows


def main() -> None:
    """Seed the fleet, time the three steps, print them as Markdown."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=20_000, help="simulated requests")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each step (median)")
    parser.add_argument("--flush-rows", type=int, default=200_000, help="rows per insert")
    args = parser.parse_args()

    with seeded_chdb("kvscope-floor-", "bench", args.requests) as client:
        events = int(client.command(f"SELECT count() FROM {EVENTS}"))
        sources = int(client.command(f"SELECT uniqExact(instance, dp_rank) FROM {EVENTS}"))
        derive = _median_cpu(args.repeat, lambda: residency.rebuild(client))
        intervals = int(client.command("SELECT count() FROM kv_block_intervals"))
        measured = {"derive (residency.rebuild, as now)": (derive, events)}
        for table in (EVENTS, *DERIVED):
            measured[f"write {table}"] = _time_reinsert(client, table, args.flush_rows, args.repeat)

    raw = measured[f"write {EVENTS}"][0]
    derived = [measured[f"write {table}"] for table in DERIVED]
    derived_total = (sum(s for s, _ in derived), sum(n for _, n in derived))
    print(
        f"# Materialization floor, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {events:,} block events from {sources} sources, "
        f"{intervals:,} closed intervals, medians of {args.repeat}\n"
    )
    print("| step | rows | CPU s | ns per block event | x storing the raw events |")
    print("|---|---:|---:|---:|---:|")
    rows = [*measured.items(), ("write the derived rows (the three above)", derived_total)]
    for name, (seconds, count) in rows:
        per_event = seconds / events * 1e9
        print(f"| {name} | {count:,} | {seconds:.3f} | {per_event:,.0f} | {seconds / raw:.2f} |")


if __name__ == "__main__":
    main()

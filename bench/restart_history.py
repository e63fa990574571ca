"""Queries over a fleet's restart history: what the blocks earlier engine runs left open cost.

An engine restart is a new epoch of the same source, and the blocks the old epoch still
held stay in `kv_block_open` for good (nothing ends them but the restart, which the queries
find from the progress: `sql/queries/_epoch_restarts.sql`). A fleet restarted daily for a
deploy thus gains up to a cache's worth of rows per source and day. The window queries read
only the epochs that can have a row in their window (`_open_in_window.sql`,
`_stores_in_window.sql`, `duplication`): this measures that they cost the same whatever
the history holds. For each count in `--restarts`, in a fresh embedded chDB database with
kvscope's schema:

- `--sources` sources run that many times plus once, one hour each, one after the other
  (each run a new epoch, as after a restart). In each run a source stores hashes in records
  of 8 events of 8 hashes: events 0-2 and 4-5 store new hashes, event 3 removes event 0's
  and event 6 stores them again (a refault), event 7 removes event 4's; so each run leaves
  `--open` blocks resident when the next one begins. Sources in groups of 4 store the same
  hashes (routing opportunity and duplication have something to find). One engine-stats row
  per source and run (the what-if needs capacity and prefix queries);
- the residency is derived as a collector does, one refresh per run (`residency.refresh`);
- every window query over the second half hour of the last run (`duplication` at its
  end), best of 3: a window the previous run's blocks do not reach (they end at the last
  run's first event), so every count measures the same rows in the window.

The baseline, measured in the same run: the same database after deleting the rows the
earlier runs left open (the answers must not change, and the bench checks that they do not,
quantiles aside). Results go to stdout as Markdown (docs/benchmarks/history.md, "Restart history").

    python bench/restart_history.py [--restarts 1,8,32] [--sources 16] [--open 20000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import time
from typing import Any

from kvscope.analytics.queries import run_query
from kvscope.collector.storage import residency, tables
from query_scale import fresh_chdb  # bench/ is on sys.path when run as a script

EVENTS = tables.KV_BLOCK_EVENTS.name
STATS = tables.ENGINE_STATS.name
OPEN = tables.KV_BLOCK_OPEN.name
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RUN = dt.timedelta(hours=1)
HASHES_PER_EVENT = 8
OPEN_PER_RECORD = 4 * HASHES_PER_EVENT
"""Blocks a record leaves resident: events 1, 2, 5 and 6's hashes."""
WINDOW_QUERIES = (
    "residency",
    "routing_opportunity",
    "refaults",
    "capacity_what_if",
    "report_residency_histogram",
)
QUANTILE_QUERIES = ("residency", "refaults")
"""Their t-digest quantiles depend on the order rows arrive in, so they are not compared."""
RECORD = (
    (0, "stored"),
    (1, "stored"),
    (2, "stored"),
    (0, "removed"),
    (4, "stored"),
    (5, "stored"),
    (0, "stored"),
    (4, "removed"),
)
"""The 8 events of a record: whose hashes each names (an event of the record) and what it
does to them."""
_PATTERN = "[" + ",".join(f"({names},'{event}')" for names, event in RECORD) + "]"


def _run(client: Any, run: int, sources: int, records: int) -> None:
    """Run `run` of every source: its block events and one engine-stats row each."""
    ts0 = START + run * RUN
    step_us = int(RUN.total_seconds() * 1e6) // (records + 1)
    client.command(
        f"""INSERT INTO {EVENTS} (instance, dp_rank, model, role, engine, epoch, seq, ts,
            event_index, position, event, block_hash, parent_hash, block_size, tokens, medium,
            _topic, _partition, _offset)
        SELECT 's' || toString(s), 0, 'm', 'both', 'vllm', cityHash64(s, {run}), r,
               {{ts0:DateTime64(6)}} + toIntervalMicrosecond((r + 1) * {step_us} + s * 1000), e, p,
               {_PATTERN}[e + 1].2,
               cityHash64(intDiv(s, 4), {run}, r, {_PATTERN}[e + 1].1, p), 0, 16, 16, 'GPU',
               'kv', s, {run * records} + r
        FROM (SELECT number AS s FROM numbers({sources})) AS a
        CROSS JOIN (SELECT number AS r FROM numbers({records})) AS b
        CROSS JOIN (SELECT number AS e FROM numbers(8)) AS c
        CROSS JOIN (SELECT number AS p FROM numbers({HASHES_PER_EVENT})) AS d""",
        parameters={"ts0": ts0},
    )
    client.command(
        f"""INSERT INTO {STATS} (instance, dp_rank, model, role, engine, epoch, seq, ts,
            capacity_blocks, block_size, usage, running, waiting, prefix_queries, prefix_hits,
            preemptions, interval_s, _topic, _partition, _offset)
        SELECT 's' || toString(s), 0, 'm', 'both', 'vllm', cityHash64(s, {run}), 0,
               {{ts:DateTime64(6)}}, {records * OPEN_PER_RECORD}, 16, 0.9, 8, 0,
               {records * 64 * 16}, {records * 16 * 16}, 0, 10, 'stats', s, {run}
        FROM (SELECT number AS s FROM numbers({sources}))""",
        parameters={"ts": ts0 + RUN / 2},
    )


def _time_queries(client: Any, until: dt.datetime) -> dict[str, tuple[float, list]]:
    """Each window query over the half hour before `until` (`duplication` at `until`):
    best of 3 seconds and its rows."""
    window = {"since": until - RUN / 2, "until": until}
    out = {}
    for name in (*WINDOW_QUERIES, "duplication"):
        params = {"until": until} if name == "duplication" else window
        times = []
        for _ in range(3):
            started = time.perf_counter()
            rows = run_query(client, name, params)
            times.append(time.perf_counter() - started)
        out[name] = (min(times), rows)
    return out


def _measure(client: Any, args: argparse.Namespace, restarts: int) -> dict[str, Any]:
    """Derive `restarts` + 1 runs of the fleet, time the window queries at its end, then
    again without the rows the earlier runs left open (the baseline)."""
    records = max(1, args.open // OPEN_PER_RECORD)
    for run in range(restarts + 1):
        _run(client, run, args.sources, records)
        residency.refresh(client)
    until = START + (restarts + 1) * RUN
    open_rows = int(client.command(f"SELECT count() FROM {OPEN} FINAL"))
    with_history = _time_queries(client, until)
    client.command(
        f"ALTER TABLE {OPEN} DELETE WHERE (instance, dp_rank, epoch) NOT IN "
        "(SELECT instance, dp_rank, argMax(epoch, first_ts) FROM kv_residency_progress "
        "GROUP BY instance, dp_rank)",
        settings={"mutations_sync": 2},
    )
    dead_rows = open_rows - int(client.command(f"SELECT count() FROM {OPEN} FINAL"))
    without = _time_queries(client, until)
    for name, (_, rows) in with_history.items():
        if rows != without[name][1] and name not in QUANTILE_QUERIES:
            raise SystemExit(f"{name}: the earlier runs' open rows changed its answer")
    return {
        "open": open_rows,
        "dead": dead_rows,
        "seconds": {name: seconds for name, (seconds, _) in with_history.items()},
        "baseline": {name: seconds for name, (seconds, _) in without.items()},
    }


def main() -> None:
    """Measure each restart count in a fresh database, print the table as Markdown."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--restarts", default="1,8,32", help="restarts before the measured run")
    parser.add_argument("--sources", type=int, default=16, help="sources (instance, dp rank)")
    parser.add_argument(
        "--open", type=int, default=20_000, help="blocks each run leaves resident per source"
    )
    args = parser.parse_args()
    counts = [int(r) for r in args.restarts.split(",")]

    results = {}
    for restarts in counts:
        with fresh_chdb("kvscope-restarts-", "bench") as client:
            results[restarts] = _measure(client, args, restarts)
        print(f"measured {restarts} restarts", flush=True)

    names = list(results[counts[0]]["seconds"])
    print(
        f"\n# Restart history, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {args.sources} sources, {args.open:,} blocks left resident "
        "per source and run; seconds (best of 3), x the same database without the rows "
        "the earlier runs left open\n"
    )
    print(
        "| restarts | open rows | of earlier runs | " + " | ".join(f"{n} | x" for n in names) + " |"
    )
    print("|---:|---:|---:|" + "---:|---:|" * len(names))
    for restarts, r in results.items():
        cells = " | ".join(
            f"{r['seconds'][n]:.3f} | {r['seconds'][n] / r['baseline'][n]:.2f}" for n in names
        )
        print(f"| {restarts} | {r['open']:,} | {r['dead']:,} | {cells} |")


if __name__ == "__main__":
    main()

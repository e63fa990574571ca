"""Residency progress over uptime: refresh and query time of a collector that ran for days.

Every residency publish appends one `kv_residency_progress` row per source epoch it
derived, so a collector refreshing every `--interval` seconds on `--sources` sources adds
sources x 86,400 / interval rows a day. The refresh and the `duplication` and
`routing_opportunity` queries read each source epoch's latest progress; migration 010's
`latest` projection answers those reads without reading every row. For each uptime in
`--days`, in a fresh embedded chDB database with kvscope's schema:

- the progress history of that uptime, generated in SQL (one row per source and refresh,
  each source with its running counts);
- `--increments` times (after one more that warms up): `--events` new block events per
  source (8 hashes per event, stores with some removals of stored hashes), derived by
  `residency.refresh`; the increments alternate between reading the progress through the
  projection (as kvscope does) and with projections off (`optimize_use_projections = 0`,
  as every read was before migration 010: the baseline);
- `duplication` at the end, both ways, best of 3.

Medians, wall seconds. Results go to stdout as Markdown (docs/benchmarks/history.md, "Residency
progress over uptime").

    python bench/residency_progress.py [--days 0,1,7,30] [--sources 64] [--interval 10]
        [--events 15000] [--increments 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import time
from typing import Any

from kvscope.analytics.queries import run_query
from kvscope.collector.storage import residency, tables
from query_scale import fresh_chdb  # bench/ is on sys.path when run as a script

EVENTS = tables.KV_BLOCK_EVENTS.name
PROGRESS = tables.KV_RESIDENCY_PROGRESS.name
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HASHES_PER_EVENT = 8
BASELINE = "projections off (before 010)"
KVSCOPE = "latest projection (010)"


def _history(client: Any, sources: int, refreshes: int, interval: float) -> None:
    """`refreshes` progress rows per source (generation g: the g-th refresh), as a
    collector refreshing every `interval` seconds leaves them."""
    chunk = 100_000
    for first in range(0, refreshes, chunk):
        count = min(chunk, refreshes - first)
        client.command(
            f"""INSERT INTO {PROGRESS}
            SELECT 's' || toString(number % {sources}), 0, 1, g * 100, g * 800, g * 200, 0,
                   {{start:DateTime64(6)}},
                   {{start:DateTime64(6)}} + toIntervalMillisecond(toUInt64(g * {interval * 1000})),
                   g
            FROM (SELECT number, intDiv(number, {sources}) + 1 + {first} AS g
                  FROM numbers({count * sources}))""",
            parameters={"start": START},
        )


def _increment(client: Any, sources: int, events: int, refreshes: int, step: int) -> None:
    """`events` block events per source after the history (records of 8 events of 8
    hashes; every fourth event removes the hashes its record stored first)."""
    records = max(1, events // (8 * HASHES_PER_EVENT))
    first_seq = refreshes * 100 + step * records + 1
    ts0 = START + dt.timedelta(days=1000, seconds=step)
    client.command(
        f"""INSERT INTO {EVENTS} (instance, dp_rank, model, role, engine, epoch, seq, ts,
            event_index, position, event, block_hash, parent_hash, block_size, tokens, medium,
            _topic, _partition, _offset)
        SELECT 's' || toString(s), 0, 'm', 'both', 'vllm', 1, {first_seq} + r,
               {{ts0:DateTime64(6)}} + toIntervalMicrosecond(r), e, p,
               if(e % 4 = 3, 'removed', 'stored'),
               cityHash64(s, {step}, r, if(e % 4 = 3, e - 3, e), p), 0, 16, 16, 'GPU',
               'kv', 0, r
        FROM (SELECT number AS s FROM numbers({sources})) AS a
        CROSS JOIN (SELECT number AS r FROM numbers({records})) AS b
        CROSS JOIN (SELECT number AS e FROM numbers(8)) AS c
        CROSS JOIN (SELECT number AS p FROM numbers({HASHES_PER_EVENT})) AS d""",
        parameters={"ts0": ts0},
    )


def _measure(client: Any, args: argparse.Namespace, days: float) -> dict[str, Any]:
    """Refresh and duplication times at `days` of uptime, both ways."""
    refreshes = int(days * 86_400 / args.interval)
    _history(client, args.sources, refreshes, args.interval)
    client.command(f"OPTIMIZE TABLE {PROGRESS} FINAL")
    rows = int(client.command(f"SELECT count() FROM {PROGRESS}"))
    refresh: dict[str, list[float]] = {KVSCOPE: [], BASELINE: []}
    for step in range(args.increments + 1):  # the first one warms up, not measured
        side = (BASELINE, KVSCOPE)[step % 2]
        client.set_client_setting("optimize_use_projections", int(side == KVSCOPE))
        _increment(client, args.sources, args.events, refreshes, step)
        started = time.perf_counter()
        residency.refresh(client)
        if step:
            refresh[side].append(time.perf_counter() - started)
    until = START + dt.timedelta(days=1001)
    duplication: dict[str, list[float]] = {KVSCOPE: [], BASELINE: []}
    for _ in range(3):
        for side in (KVSCOPE, BASELINE):
            client.set_client_setting("optimize_use_projections", int(side == KVSCOPE))
            started = time.perf_counter()
            run_query(client, "duplication", {"until": until})
            duplication[side].append(time.perf_counter() - started)
    return {
        "rows": rows,
        "refresh": {side: statistics.median(t) for side, t in refresh.items()},
        "duplication": {side: min(t) for side, t in duplication.items()},
    }


def main() -> None:
    """Measure each uptime in a fresh database, print the table as Markdown."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--days", default="0,1,7,30", help="uptimes to measure, in days")
    parser.add_argument("--sources", type=int, default=64, help="sources (instance, dp rank)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes")
    parser.add_argument(
        "--events", type=int, default=15_000, help="block events per source and increment"
    )
    parser.add_argument("--increments", type=int, default=4, help="increments (alternating sides)")
    args = parser.parse_args()
    uptimes = [float(d) for d in args.days.split(",")]

    results = {}
    for days in uptimes:
        with fresh_chdb("kvscope-progress-", "bench") as client:
            results[days] = _measure(client, args, days)
        print(f"measured {days:g} days", flush=True)

    print(
        f"\n# Residency progress over uptime, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {args.sources} sources, a refresh every {args.interval:g} s, "
        f"{args.events:,} block events per source and increment\n"
    )
    print(
        "| uptime | progress rows | refresh, before 010 | refresh, with 010 | x | "
        "duplication, before 010 | duplication, with 010 | x |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for days, r in results.items():
        ref, dup = r["refresh"], r["duplication"]
        print(
            f"| {days:g} d | {r['rows']:,} | {ref[BASELINE]:.3f} s | {ref[KVSCOPE]:.3f} s | "
            f"{ref[BASELINE] / ref[KVSCOPE]:.2f} | {dup[BASELINE] * 1000:.0f} ms | "
            f"{dup[KVSCOPE] * 1000:.0f} ms | {dup[BASELINE] / dup[KVSCOPE]:.2f} |"
        )


if __name__ == "__main__":
    main()

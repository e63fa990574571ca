"""ClickHouse bytes per row and per instance-day of kvscope's tables, from a simulated fleet.

Runs bench/query_scale.py's simulated fleet straight into a fresh embedded chDB
database (rows built by the collector's own decode and column code), merges every table
to one part per partition (`OPTIMIZE ... FINAL`, what background merges converge to) and
reads `system.parts`:
rows and compressed bytes per table, bytes per row, and bytes per instance-day at the
simulated event rate. Not a timing benchmark: the numbers do not depend on machine load.
Results go to stdout as Markdown (docs/operations.md's sizing section quotes them).

    python bench/storage_footprint.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
from typing import Any

from kvscope.collector.storage import tables
from query_scale import seeded_chdb  # bench/ is on sys.path when run as a script

PARTS = (
    "SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) "
    "FROM system.parts WHERE database = currentDatabase() AND active AND rows > 0 "
    "GROUP BY table ORDER BY table"
)


def _span(client: Any) -> tuple[int, float]:
    """(number of sources, simulated seconds) of the fleet in `client`."""
    span = client.query(
        "SELECT dateDiff('millisecond', min(ts), max(ts)) / 1000, uniqExact(instance, dp_rank) "
        f"FROM {tables.KV_BLOCK_EVENTS.name}"
    ).result_rows[0]
    return int(span[1]), float(span[0])


def main() -> None:
    """Simulate, merge, and print the footprint table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    with seeded_chdb("kvscope-footprint-", "footprint", args.requests) as client:
        sources, seconds = _span(client)
        tables = [row[0] for row in client.query("SHOW TABLES").result_rows]
        for table in tables:
            if not table.endswith("_mv"):
                client.command(f"OPTIMIZE TABLE {table} FINAL")
        rows = client.query(PARTS).result_rows
        print(
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
            f"query_scale's fleet ({sources} sources), {args.requests} requests, "
            f"{seconds:.0f} simulated seconds\n"
        )
        print("| table | rows | compressed bytes | bytes/row | ratio | MB per instance-day |")
        print("|---|---:|---:|---:|---:|---:|")
        for table, count, packed, raw in rows:
            per_day = packed / sources / seconds * 86_400 / 1e6
            print(
                f"| {table} | {count:,} | {packed:,} | {packed / count:.1f} | "
                f"{raw / packed:.1f} | {per_day:,.1f} |"
            )


if __name__ == "__main__":
    main()

"""`kvscope derive`: bring the materialized residency up to date, or rebuild it from raw rows."""

from __future__ import annotations

import argparse

from kvscope.cli.commands import COMMANDS
from kvscope.collector.storage.residency import MAX_RECORDS
from kvscope.collector.storage.target import add_clickhouse_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `derive` command."""
    parser = subparsers.add_parser(
        "derive",
        help=COMMANDS["derive"],
        description=(
            "Derive the materialized residency (closed and open intervals, last removals, "
            "progress) from the block events stored since the last refresh; the collector "
            "and `kvscope query` do this themselves. --rebuild empties the derived tables "
            "and derives them again from every raw event (the raw tables are the source of "
            "truth). Run it while no collector refreshes the same database."
        ),
    )
    add_clickhouse_argument(parser)
    parser.add_argument(
        "--rebuild", action="store_true", help="start from empty derived tables (default: off)"
    )
    parser.add_argument(
        "--max-records",
        type=int,
        default=MAX_RECORDS,
        help="records per step, over whole sources (default: %(default)s)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Refresh (or rebuild) and print what was derived."""
    import time

    from kvscope.collector.errors import SinkError
    from kvscope.collector.storage import residency
    from kvscope.collector.storage.migrate import migrate
    from kvscope.collector.storage.target import parse_target
    from kvscope.schemas.errors import ConfigError, KvscopeError
    from kvscope.serve.access import open_existing

    if args.max_records < 1:
        raise ConfigError("--max-records must be >= 1")
    target = parse_target(args.clickhouse)
    try:
        client = open_existing(target)
    except KvscopeError:
        raise
    except Exception as exc:
        raise SinkError(f"cannot connect to {target.safe_url}: {exc}") from exc
    try:
        migrate(client, target)
        started = time.perf_counter()
        derive = residency.rebuild if args.rebuild else residency.refresh
        result = derive(client, args.max_records)
    except Exception as exc:
        raise SinkError(f"deriving failed: {str(exc).strip().splitlines()[0]}") from exc
    finally:
        client.close()
    print(
        f"kvscope derive: {result.events:,} block events of {result.sources} source-epochs in "
        f"{result.generations} steps ({time.perf_counter() - started:.1f} s)"
        + (", finished an interrupted publish first" if result.recovered else "")
    )
    return 0

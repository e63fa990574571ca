"""`kvscope migrate`: create or upgrade kvscope's ClickHouse tables."""

from __future__ import annotations

import argparse

from kvscope.collector.storage.target import add_clickhouse_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `migrate` command."""
    parser = subparsers.add_parser(
        "migrate",
        help="create or upgrade kvscope's ClickHouse tables",
        description=(
            "Apply the pending schema migrations (sql/migrations) to a ClickHouse server or "
            "an embedded chDB directory. Idempotent: running it again changes nothing. "
            "Optionally sets the retention (TTL) of raw and aggregate tables."
        ),
    )
    add_clickhouse_argument(parser)
    parser.add_argument(
        "--ttl-days",
        type=int,
        default=None,
        help="keep raw rows this many days (0: forever; default: leave unchanged)",
    )
    parser.add_argument(
        "--aggregate-ttl-days",
        type=int,
        default=None,
        help="keep per-minute aggregates this many days (0: forever; default: unchanged)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Apply migrations and print what was done."""
    from kvscope.collector.storage.migrate import run_migrations
    from kvscope.collector.storage.target import parse_target

    target = parse_target(args.clickhouse)
    applied = run_migrations(target, args.ttl_days, args.aggregate_ttl_days)
    if applied:
        print(f"kvscope migrate: applied {', '.join(f'{v:03d}' for v in applied)} to {target}")
    else:
        print(f"kvscope migrate: {target} is up to date")
    return 0

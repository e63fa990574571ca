"""`kvscope migrate`: create or upgrade kvscope's ClickHouse tables."""

from __future__ import annotations

import argparse

from kvscope.cli.commands import COMMANDS
from kvscope.collector.storage.target import add_clickhouse_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `migrate` command."""
    parser = subparsers.add_parser(
        "migrate",
        help=COMMANDS["migrate"],
        description=(
            "Apply the pending schema migrations (sql/migrations) to a ClickHouse server or "
            "an embedded chDB directory. Idempotent: running it again changes nothing. "
            "Optionally sets the retention (TTL) of raw and aggregate tables. With --cluster, "
            "creates replicated shard-local tables ON CLUSTER plus Distributed tables for "
            "reads (docs/operations.md)."
        ),
    )
    add_clickhouse_argument(parser)
    parser.add_argument(
        "--ttl-days",
        type=int,
        default=None,
        help="keep raw rows this many days, at most 10000 (0: forever; default: leave unchanged)",
    )
    parser.add_argument(
        "--aggregate-ttl-days",
        type=int,
        default=None,
        help="keep per-minute aggregates this many days, at most 10000 (0: forever; "
        "default: unchanged)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="ClickHouse cluster (a remote_servers entry) for ON CLUSTER DDL with "
        "Replicated*MergeTree and Distributed tables (default: a single server)",
    )
    parser.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="print the DDL of every migration instead of applying it (no connection)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Apply migrations and print what was done (or, with --print, the DDL only)."""
    from kvscope.collector.storage.migrate import (
        check_ttl_days,
        planned_statements,
        run_migrations,
    )
    from kvscope.collector.storage.target import parse_target
    from kvscope.serve.access import check_writable

    if args.print_only:
        statements = planned_statements(args.cluster)
        print("".join(f"{statement};\n\n" for statement in statements), end="")
        return 0
    target = parse_target(args.clickhouse)
    for flag, days in (
        ("--ttl-days", args.ttl_days),
        ("--aggregate-ttl-days", args.aggregate_ttl_days),
    ):
        if days is not None:
            check_ttl_days(days, flag)
    check_writable(target)
    applied = run_migrations(target, args.ttl_days, args.aggregate_ttl_days, args.cluster)
    if applied:
        print(f"kvscope migrate: applied {', '.join(f'{v:03d}' for v in applied)} to {target}")
    else:
        print(f"kvscope migrate: {target} is up to date")
    return 0

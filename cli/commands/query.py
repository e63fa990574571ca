"""`kvscope query`: run one of the SQL analytics in `sql/queries/` and print its rows."""

from __future__ import annotations

import argparse
import sys

from kvscope.cli.commands import COMMANDS
from kvscope.collector.storage.target import add_clickhouse_argument
from kvscope.schemas.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `query` command."""
    p = subparsers.add_parser(
        "query",
        help=COMMANDS["query"],
        description=(
            "Run a parameterized analytics query from sql/queries/ against the ClickHouse "
            "target and print the rows. Common parameters: since, until (ISO time, epoch "
            "seconds or a duration ago like 2h; until defaults to now), instance, model "
            "('' = all). While `kvscope serve` holds the chDB directory the query runs "
            "through it. docs/analytics.md explains each query."
        ),
    )
    p.add_argument("name", nargs="?", help="query name")
    p.add_argument("--list", action="store_true", help="list the queries and exit")
    add_clickhouse_argument(p)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="K=V",
        help="query parameter, repeatable; times as ISO 8601, epoch seconds or a duration "
        "ago (since=2h) (default: none)",
    )
    p.add_argument(
        "--format",
        choices=["table", "json", "csv"],
        default="table",
        help="output format (default: %(default)s)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """List the queries, or run one and print its rows."""
    from kvscope.analytics import queries

    if args.list:
        listed = queries.list_queries()
        if args.format != "table":
            rows = [
                {"name": q.name, "description": q.description, "params": ", ".join(q.params)}
                for q in listed
            ]
            text = queries.format_rows(rows, args.format)
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            return 0
        for q in listed:
            names = ", ".join(q.params)
            print(f"{q.name:28} {q.description}" + (f" [{names}]" if names else ""))
        return 0
    if not args.name:
        raise ConfigError("name a query, or use --list")
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r}: use K=V, naming the parameter as K")
        if key.strip() in params:
            raise ConfigError(f"--param {key.strip()} given more than once: give each once")
        params[key.strip()] = value
    query = queries.load_query(args.name)
    bound = queries.bind_params(query, params)

    from kvscope.collector.storage.target import parse_target
    from kvscope.serve.access import open_reader

    client = open_reader(parse_target(args.clickhouse))
    try:
        rows = queries.run_query(client, args.name, bound)
    finally:
        client.close()
    text = queries.format_rows(rows, args.format)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")  # CSV ends its lines
    return 0

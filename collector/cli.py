"""The `kvscope` command: one subcommand per module in `kvscope.collector.commands`.

Each command module defines `register(subparsers)`, which adds its parser and sets
`run` (a function of the parsed arguments returning an exit code). Modules import
their heavy dependencies inside `run`, so `kvscope --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from kvscope.collector import commands
from kvscope.schemas.errors import ConfigError, KvscopeError


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every command module registered."""
    parser = argparse.ArgumentParser(
        prog="kvscope",
        description=(
            "KV-cache telemetry for LLM inference fleets: engines publish KV-cache events, "
            "engine stats, finished requests and KV transfers to Kafka; the collector "
            "stores them exactly once in ClickHouse; queries and reports read them."
        ),
        epilog="Run `kvscope COMMAND --help` for the options of one command.",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity (default: %(default)s)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvscope` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"kvscope {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KvscopeError as exc:
        print(f"kvscope {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"kvscope {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`kvscope serve`: collect, and serve the queries, report and a live dashboard over HTTP."""

from __future__ import annotations

import argparse
import os
import sys

from kvscope.cli.commands import COMMANDS, add_flags, listen_flags
from kvscope.cli.commands.collect import add_collector_options, collector_config
from kvscope.serve.service import DEFAULT_HOST, DEFAULT_PORT, ServeOptions
from kvscope.serve.state import TOKEN_ENV


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` command."""
    parser = subparsers.add_parser(
        "serve",
        help=COMMANDS["serve"],
        description=(
            "Run the collector (same options as `kvscope collect`) and, on the same "
            "ClickHouse client, a read-only HTTP server: / (live dashboard), /api/queries, "
            "/api/query/NAME?K=V, /report, /metrics, /healthz. While it runs, `kvscope query` "
            "and `kvscope report` on the same chDB directory read through it. Binding a "
            f"non-loopback --host needs --token (or ${TOKEN_ENV}). Stops cleanly on "
            "SIGTERM/SIGINT."
        ),
    )
    add_collector_options(parser)
    add_flags(parser, listen_flags(DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check Kafka and the directory first, then collect and serve until a signal."""
    from kvscope.serve.access import check_kafka, check_writable
    from kvscope.serve.service import Serve

    config = collector_config(args)
    options = ServeOptions(args.host, args.port, args.token or os.environ.get(TOKEN_ENV) or None)
    options.validate()
    check_writable(config.target)
    check_kafka(config.bootstrap_servers, config.security_protocol)

    def ready(serve: Serve) -> None:
        print(f"kvscope serve: dashboard at {serve.url}/", flush=True)
        print(f"  collecting from {config.bootstrap_servers} into {config.target}", flush=True)

    if config.metrics_port is not None:
        from kvscope.collector.pipeline import metrics

        metrics.serve(config.metrics_port, config.metrics_host)
    serve = Serve(config, options)
    serve.run(on_ready=ready)
    print(f"kvscope serve: stopped; stored {serve.stored_rows:,} rows", file=sys.stderr)
    return 0

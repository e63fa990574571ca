"""`kvscope collect`: run the collector (Kafka -> ClickHouse, exactly once)."""

from __future__ import annotations

import argparse

from kvscope.cli.commands import COMMANDS, Flag, add_flags, add_security_options, security_flags
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.storage.target import Target, add_clickhouse_argument, parse_target

DEFAULTS = CollectorConfig(target=Target(scheme="chdb"))
"""The option defaults: `CollectorConfig`'s own (one source of defaults). The target is
given, so building the parser never reads $KVSCOPE_CLICKHOUSE_URL (a bad one would break
`--help`); the command reads it when it runs."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `collect` command."""
    parser = subparsers.add_parser(
        "collect",
        help=COMMANDS["collect"],
        description=(
            "Consume kvscope's Kafka streams in a consumer group and store them "
            "exactly once in ClickHouse (a server or embedded chDB), applying pending "
            "migrations first. Stops cleanly (flush, commit) on SIGTERM/SIGINT."
        ),
    )
    add_collector_options(parser)
    parser.set_defaults(run=run)


def add_collector_options(parser: argparse.ArgumentParser) -> None:
    """The collector's options (shared by every command that runs a collector)."""
    add_flags(
        parser,
        [
            Flag(
                "--bootstrap-servers",
                "Kafka bootstrap servers, host:port[,host:port]",
                DEFAULTS.bootstrap_servers,
            )
        ],
    )
    add_clickhouse_argument(parser)
    add_flags(
        parser,
        [
            Flag("--group", "consumer group", DEFAULTS.group),
            Flag("--topic-prefix", "topic prefix", DEFAULTS.topic_prefix),
            Flag(
                "--metrics-port",
                "serve Prometheus /metrics on this port (default: off)",
                DEFAULTS.metrics_port,
                int,
            ),
            Flag("--metrics-host", "address for /metrics", DEFAULTS.metrics_host),
            Flag(
                "--exit-when-idle",
                "stop once partitions are assigned and no record arrived for SECONDS "
                "(default: never)",
                DEFAULTS.exit_when_idle,
                float,
                "SECONDS",
            ),
            Flag("--batch-rows", "flush at this many rows", DEFAULTS.batch_rows, int),
            Flag(
                "--batch-seconds",
                "flush at the latest this long after the first buffered record",
                DEFAULTS.batch_seconds,
                float,
            ),
        ],
    )
    add_security_options(parser)
    add_flags(
        parser,
        [
            Flag(
                "--session-timeout-ms",
                "Kafka group session timeout",
                DEFAULTS.session_timeout_ms,
                int,
            ),
            Flag(
                "--cluster",
                "ClickHouse cluster of `kvscope migrate --cluster`: write the shard-local "
                "replicated tables of the node in --clickhouse (default: a single server)",
                DEFAULTS.cluster,
                metavar="NAME",
            ),
            Flag(
                "--no-residency",
                "do not refresh the materialized residency (default: refresh; one refresher "
                "per database: use this on all but one collector of a server; queries then "
                "refresh)",
                action="store_true",
            ),
            Flag(
                "--residency-interval",
                "while block events arrive, refresh the residency at most this often (0: "
                "after every batch); also when the collector goes quiet and when it stops "
                f"(default: {DEFAULTS.residency_interval_s:g})",
                DEFAULTS.residency_interval_s,
                float,
                "SECONDS",
            ),
        ],
    )


def collector_config(args: argparse.Namespace) -> CollectorConfig:
    """The validated `CollectorConfig` of parsed collector options (Kafka security from the
    flags over the `KVSCOPE_*` variables the publisher reads too)."""
    from kvscope.common.kafka import KafkaSettings

    return CollectorConfig(
        bootstrap_servers=args.bootstrap_servers,
        target=parse_target(args.clickhouse),
        group=args.group,
        topic_prefix=args.topic_prefix,
        batch_rows=args.batch_rows,
        batch_seconds=args.batch_seconds,
        exit_when_idle=args.exit_when_idle,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        session_timeout_ms=args.session_timeout_ms,
        cluster=args.cluster,
        kafka=KafkaSettings.from_env(args.bootstrap_servers, **security_flags(args)),
        residency=not args.no_residency,
        residency_interval_s=args.residency_interval,
    ).validate()


def run(args: argparse.Namespace) -> int:
    """Build the config, serve metrics, run until a signal or idle."""
    import asyncio
    import signal
    import sys

    from kvscope.collector.pipeline import metrics
    from kvscope.collector.pipeline.service import Collector
    from kvscope.serve.access import check_kafka, check_writable

    config = collector_config(args)
    check_writable(config.target)
    check_kafka(config.bootstrap_servers, config.security_protocol)
    collector = Collector(config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, collector.request_stop)
        await collector.run()

    if config.metrics_port is not None:
        metrics.serve(config.metrics_port, config.metrics_host)
    asyncio.run(main())
    print(f"kvscope collect: stopped; stored {metrics.rows_inserted():,} rows", file=sys.stderr)
    return 0

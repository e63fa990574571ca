"""`kvscope collect`: run the collector (Kafka -> ClickHouse, exactly once)."""

from __future__ import annotations

import argparse

from kvscope.collector.storage.target import add_clickhouse_argument
from kvscope.schemas import DEFAULT_TOPIC_PREFIX


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `collect` command."""
    parser = subparsers.add_parser(
        "collect",
        help="store kvscope's Kafka streams in ClickHouse, exactly once",
        description=(
            "Consume kvscope's four Kafka streams in a consumer group and store them "
            "exactly once in ClickHouse (a server or embedded chDB), applying pending "
            "migrations first. Stops cleanly (flush, commit) on SIGTERM/SIGINT."
        ),
    )
    parser.add_argument(
        "--bootstrap-servers",
        default="127.0.0.1:9092",
        help="Kafka bootstrap servers, host:port[,host:port] (default: %(default)s)",
    )
    add_clickhouse_argument(parser)
    parser.add_argument(
        "--group", default="kvscope-collector", help="consumer group (default: %(default)s)"
    )
    parser.add_argument(
        "--topic-prefix", default=DEFAULT_TOPIC_PREFIX, help="topic prefix (default: %(default)s)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port"
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for /metrics (default: %(default)s)"
    )
    parser.add_argument(
        "--exit-when-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop once partitions are assigned and no record arrived for SECONDS",
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=200_000,
        help="flush at this many rows (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-seconds",
        type=float,
        default=1.0,
        help="flush at the latest this long after the first buffered record (default: %(default)s)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=10_000,
        help="Kafka group session timeout (default: %(default)s)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Build the config, serve metrics, run until a signal or idle."""
    import asyncio
    import signal

    from kvscope.collector.pipeline import metrics
    from kvscope.collector.pipeline.config import CollectorConfig
    from kvscope.collector.pipeline.service import Collector
    from kvscope.collector.storage.target import parse_target

    config = CollectorConfig(
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
    ).validate()
    collector = Collector(config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, collector.request_stop)
        await collector.run()

    if config.metrics_port is not None:
        metrics.serve(config.metrics_port, config.metrics_host)
    asyncio.run(main())
    return 0

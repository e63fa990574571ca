"""`kvscope relay`: the per-host Kafka client that engines hand their encoded records to."""

from __future__ import annotations

import argparse

from kvscope.cli.commands import COMMANDS, Flag, add_flags, add_security_options, security_flags
from kvscope.publisher.relay.config import RelayConfig, default_listen

DEFAULTS = RelayConfig()
"""The option defaults: `RelayConfig`'s own (one source of defaults)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `relay` command."""
    parser = subparsers.add_parser(
        "relay",
        help=COMMANDS["relay"],
        description=(
            "Take encoded kvscope records from the engine processes of this host over a "
            "local ZMQ socket and produce them to Kafka, so no Kafka client runs inside an "
            "engine. Engines point at it with KVSCOPE_RELAY (or ?relay= in the kafka:// "
            "endpoint) set to the --listen address. Each batch is acked back with what was "
            "lost, and the engine reports those losses as Gaps. See docs/publisher.md, "
            '"Relay".'
        ),
    )
    producer = DEFAULTS.producer
    add_flags(
        parser,
        [
            Flag(
                "--listen",
                "where engines connect: ipc:///PATH or tcp://HOST:PORT (default: "
                f"{default_listen()}, in $XDG_RUNTIME_DIR when set)",
                DEFAULTS.listen,
                metavar="URL",
            ),
            Flag(
                "--allow-remote",
                "accept a tcp --listen address that is not loopback",
                action="store_true",
            ),
            Flag(
                "--bootstrap-servers",
                "Kafka brokers host:port,... (required, no default)",
                required=True,
            ),
            Flag("--client-id", "Kafka client id", "kvscope-relay"),
            Flag("--compression", "record batch compression", producer.compression),
            Flag("--acks", "broker acknowledgements: all, 1 or 0", producer.acks),
            Flag(
                "--delivery-timeout",
                "a record Kafka has not acknowledged by then is acked lost",
                producer.delivery_timeout_s,
                float,
                "SECONDS",
            ),
            Flag(
                "--max-inflight-records",
                "records held for Kafka at most; batches beyond are acked lost (relay_full)",
                DEFAULTS.max_inflight_records,
                int,
                "N",
            ),
            Flag(
                "--linger-ms",
                "producer linger (batches are built per engine batch)",
                DEFAULTS.linger_ms,
                float,
                "MS",
            ),
            Flag(
                "--metrics-port",
                "serve the relay's /metrics on this port (default: off)",
                type=int,
                metavar="PORT",
            ),
            Flag("--metrics-host", "address of that listener", "127.0.0.1"),
        ],
    )
    add_security_options(parser)
    parser.set_defaults(run=run)


def config_of(args: argparse.Namespace) -> RelayConfig:
    """The validated `RelayConfig` of parsed options (Kafka security from the flags over
    the `KVSCOPE_*` variables)."""
    from kvscope.publisher.config import PublisherConfig

    return RelayConfig(
        listen=args.listen,
        allow_remote=args.allow_remote,
        max_inflight_records=args.max_inflight_records,
        linger_ms=args.linger_ms,
        producer=PublisherConfig.from_env(
            bootstrap_servers=args.bootstrap_servers,
            client_id=args.client_id,
            compression=args.compression,
            acks=args.acks,
            delivery_timeout_s=args.delivery_timeout,
            relay="",
            **security_flags(args),
        ),
    ).validate()


def run(args: argparse.Namespace) -> int:
    """Run the relay in the foreground until Ctrl-C / SIGTERM (then drain and ack)."""
    import asyncio

    from kvscope.cli.commands.bridge import serve_metrics
    from kvscope.publisher.relay.service import Relay

    config = config_of(args)
    if args.metrics_port is not None:
        serve_metrics(args.metrics_port, args.metrics_host, "--metrics-port", "--metrics-host")
    relay = Relay(config)
    relay.bind()
    asyncio.run(relay.run_until_signal())
    return 0

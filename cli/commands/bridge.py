"""`kvscope bridge`: forward an unmodified engine's ZMQ KV events to Kafka."""

from __future__ import annotations

import argparse
import math
import signal
import threading
import urllib.parse
from typing import Any, get_args

from kvscope.cli.commands import COMMANDS, add_security_options, security_flags, stop_on_sigterm
from kvscope.publisher.bridge.loop import BridgeConfig
from kvscope.schemas import DEFAULT_TOPIC_PREFIX, ENGINES, ConfigError, Role

DEFAULTS = BridgeConfig()
"""The option defaults: `BridgeConfig`'s own (one source of defaults)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bridge` command."""
    parser = subparsers.add_parser(
        "bridge",
        help=COMMANDS["bridge"],
        description=(
            "Subscribe to one or more engine KV-event PUB sockets (vLLM or SGLang, as they "
            "are), repair sequence gaps from the engines' replay sockets, record a Gap for "
            "what cannot be repaired, and publish kvscope envelopes to Kafka. Give --zmq once "
            "per publisher (e.g. per DP rank) and --replay for its replay socket. With "
            "--metrics-url, also scrape the engine's Prometheus histograms into the "
            "engine-histograms stream. See docs/bridge.md."
        ),
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default=DEFAULTS.engine, help="default: %(default)s"
    )
    parser.add_argument(
        "--zmq",
        action="append",
        default=[],
        metavar="URL",
        help="engine PUB endpoint, e.g. tcp://10.0.0.5:5557 (repeatable; default: none)",
    )
    parser.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="URL",
        help="replay endpoint; the n-th --replay belongs to the n-th --zmq (default: none)",
    )
    parser.add_argument(
        "--dp-rank",
        action="append",
        default=[],
        type=int,
        metavar="N",
        help="DP rank of the n-th --zmq, used until its batches name one (default: 0)",
    )
    parser.add_argument("--instance", default="", help="instance name (default: from topic)")
    parser.add_argument("--model", default="", help="model name (default: from topic)")
    parser.add_argument(
        "--role",
        choices=get_args(Role),
        default=DEFAULTS.role,
        help="default: %(default)s",
    )
    parser.add_argument(
        "--engine-version", default="", help="engine version for the source (default: empty)"
    )
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka brokers host:port,...")
    parser.add_argument(
        "--topic-prefix", default=DEFAULT_TOPIC_PREFIX, help="(default: %(default)s)"
    )
    add_security_options(parser)
    parser.add_argument(
        "--state-dir", default=None, help="keep positions here across restarts (default: not kept)"
    )
    parser.add_argument(
        "--forward-token-ids", action="store_true", help="forward token ids of stored blocks"
    )
    parser.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="engine Prometheus endpoint to scrape, e.g. http://10.0.0.5:8000/metrics "
        "(repeatable; default: none)",
    )
    parser.add_argument(
        "--metrics-interval", type=float, default=10.0, help="seconds between scrapes (default 10)"
    )
    parser.add_argument(
        "--metrics-family",
        action="append",
        default=None,
        metavar="PREFIX",
        help="metric family-name prefix to forward (repeatable; default: the engine's "
        "KV-transfer, prefix-cache and PD-queue families)",
    )
    parser.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        help="serve the bridge's own /metrics on this port (default: off)",
    )
    parser.add_argument(
        "--prometheus-host",
        default="127.0.0.1",
        help="address of that listener (default: %(default)s, loopback only)",
    )
    parser.set_defaults(run=run)


def _endpoints(args: argparse.Namespace) -> list:
    """Pair the n-th --replay and --dp-rank with the n-th --zmq (later --zmq may have none)."""
    from kvscope.publisher.bridge.loop import Endpoint

    if len(args.replay) > len(args.zmq) or len(args.dp_rank) > len(args.zmq):
        raise ConfigError("more --replay or --dp-rank than --zmq endpoints")
    replays = args.replay + [None] * (len(args.zmq) - len(args.replay))
    ranks = args.dp_rank + [None] * (len(args.zmq) - len(args.dp_rank))
    return [
        Endpoint(zmq=z, replay=r, dp_rank=d)
        for z, r, d in zip(args.zmq, replays, ranks, strict=True)
    ]


def _scrapers(args: argparse.Namespace, kafka: Any) -> list:
    """One scraper per --metrics-url, publishing under the instance (default: URL host:port)."""
    from kvscope.publisher.bridge.scrape import (
        DEFAULT_FAMILIES,
        MetricsScraper,
        split_credentials,
    )
    from kvscope.schemas import Source

    scrapers = []
    for url in args.metrics_url:
        try:
            safe_url, _ = split_credentials(url)
        except ValueError:
            raise ConfigError("--metrics-url has an invalid port") from None
        parsed = urllib.parse.urlsplit(safe_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"--metrics-url {safe_url!r} is not an http(s) URL")
        source = Source(
            instance=args.instance or parsed.netloc,
            model=args.model,
            role=args.role,
            engine=args.engine,
            engine_version=args.engine_version,
        )
        publisher = kafka.for_source(source)
        scrapers.append(
            MetricsScraper(
                url,
                publisher.publish,
                families=args.metrics_family or DEFAULT_FAMILIES[args.engine],
                interval_s=args.metrics_interval,
            )
        )
    return scrapers


def serve_metrics(
    port: int, host: str, port_flag: str = "--prometheus-port", host_flag: str = "--prometheus-host"
) -> None:
    """A command's own /metrics listener (default registry), started before anything else;
    one-line errors naming the command's flags (the bridge's, or the relay's)."""
    from kvscope.common.kafka import unbracketed
    from prometheus_client import start_http_server

    if not 0 <= port < 65536:
        raise ConfigError(f"{port_flag} must be 0..65535, got {port}")
    try:
        start_http_server(port, addr=unbracketed(host))
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); choose another "
            f"{port_flag} or {host_flag}"
        ) from None


def run(args: argparse.Namespace) -> int:
    """Run the bridge and scrapers in the foreground until Ctrl-C / SIGTERM."""
    from kvscope.publisher.bridge.loop import Bridge
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.kafka import KafkaPublisher

    if not args.zmq and not args.metrics_url:
        raise ConfigError("give at least one --zmq endpoint or --metrics-url")
    if not 0 < args.metrics_interval < math.inf:
        raise ConfigError(
            f"--metrics-interval must be a finite number > 0, got {args.metrics_interval}"
        )
    config = BridgeConfig(
        engine=args.engine,
        endpoints=_endpoints(args),
        instance=args.instance,
        model=args.model,
        role=args.role,
        engine_version=args.engine_version,
        state_dir=args.state_dir,
        keep_token_ids=args.forward_token_ids,
    )
    if args.zmq:
        config.validate()
    if args.prometheus_port is not None:
        import kvscope.publisher.bridge.metrics  # noqa: F401  (registers the bridge counters)

        serve_metrics(args.prometheus_port, args.prometheus_host)
    kafka = KafkaPublisher(
        PublisherConfig.from_env(
            bootstrap_servers=args.bootstrap_servers,
            topic_prefix=args.topic_prefix,
            client_id="kvscope-bridge",
            **security_flags(args),
        ).validate()
    )
    scrapers = _scrapers(args, kafka)
    stop_on_sigterm()
    try:
        for scraper in scrapers:
            scraper.start()
        if args.zmq:
            bridge = Bridge(config, kafka.for_source, kafka.flush)
            # SIGTERM stops the loop between frames; it then reads what already arrived.
            signal.signal(signal.SIGTERM, lambda *_: bridge.stop(0))
            bridge.run()
        else:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for scraper in scrapers:
            scraper.stop()
        kafka.shutdown(10)
    return 0

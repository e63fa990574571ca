"""`kvscope route`: an OpenAI-compatible proxy that routes each request by kvscope's index."""

from __future__ import annotations

import argparse
import os
import sys

from kvscope.cli.commands import (
    COMMANDS,
    Flag,
    add_flags,
    add_security_options,
    listen_flags,
    security_flags,
)
from kvscope.cli.commands.index import add_feed_options, hash_seed
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.route.config import (
    ENGINE_API_KEY_ENV,
    INDEX_TOKEN_ENV,
    TOKEN_ENV,
    RouteConfig,
    parse_engines,
)

DEFAULTS = RouteConfig(engines=())
"""The option defaults: `RouteConfig`'s own (one source of defaults)."""


TUNING = (
    ("--connect-timeout", "connect_timeout_s", float, "seconds to connect to an engine"),
    ("--request-timeout", "request_timeout_s", float, "seconds to wait for an engine's answer"),
    ("--index-timeout", "index_timeout_s", float,
     "seconds a request waits for the index's scores before it is routed by load"),
    ("--tokenize-timeout", "tokenize_timeout_s", float,
     "seconds a request waits for an engine's /tokenize before it is routed by load"),
    ("--down-seconds", "down_s", float, "seconds a failed engine is skipped"),
    ("--health-interval", "health_interval_s", float,
     "seconds between engine and index health checks"),
    ("--eject-after", "eject_after", int,
     "consecutive failures (5xx, connect, break-off, stall) that eject an engine"),
    ("--eject-seconds", "eject_base_s", float,
     "an ejected engine is skipped this times the times it was ejected"),
    ("--eject-max-seconds", "eject_max_s", float, "the longest ejection"),
    ("--max-ejected-share", "max_ejected_share", float,
     "at most this share of the engines ejected at once (the first always is)"),
    ("--stall-seconds", "stall_s", float,
     "an engine without a first byte this long, while others answer, is stalled"),
    ("--max-hash-tokens", "max_hash_tokens", int,
     "tokenize and score at most this many leading prompt tokens"),
    ("--max-answer-bytes", "max_answer_bytes", int,
     "read a non-streamed answer whole up to this size before passing it on"),
    ("--max-body-bytes", "max_body_bytes", int, "largest request body; larger ones get a 413"),
)  # fmt: skip
"""The router's tuning flags: (flag, `RouteConfig` field, type, what it sets)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `route` command."""
    parser = subparsers.add_parser(
        "route",
        help=COMMANDS["route"],
        description=(
            "An OpenAI-compatible proxy (/v1/completions, /v1/chat/completions, streaming "
            "passed through, /v1/models, /healthz, /metrics) in front of vLLM engines. Per "
            "request it takes the prompt's token ids (tokenized by an engine's /tokenize, or "
            "--tokenizer), asks `kvscope index` how much of it every engine caches, and picks "
            "the best engine, weighing affinity against in-flight load (--affinity). An index "
            "that is down, slow, not ready or refuses the token means routing by load, never a "
            "refused request. Engines that fail to connect are skipped for --down-seconds; "
            "engines that fail requests in a row are ejected (--eject-after). With "
            "--index-bootstrap-servers the "
            "router holds the index itself, fed from Kafka (no round trip per request; needs "
            "kvscope[index]). See docs/routing.md."
        ),
    )
    add_flags(
        parser,
        [
            Flag(
                "--engines",
                "the engines' base URLs; NAME is the instance their kvscope plugin publishes "
                "(KVSCOPE_INSTANCE; default: HOST:PORT of the URL, loopback as this machine's "
                "hostname, which is how the plugin names a `vllm serve` by default)",
                metavar="[NAME=]URL,...",
                required=True,
            ),
            Flag(
                "--index",
                "`kvscope index` base URL (default: none; without --index-bootstrap-servers "
                "either, route by load alone)",
                DEFAULTS.index_url,
                metavar="URL",
            ),
        ],
    )
    embedded = parser.add_argument_group(
        "index in the router's process (instead of --index)",
        "the router reads the kv-events topic itself, as `kvscope index` does",
    )
    add_flags(
        embedded,
        [
            Flag(
                "--index-bootstrap-servers",
                "Kafka bootstrap servers of the kv-events topic (default: none, no index in "
                "the router)",
                metavar="SERVERS",
            ),
            Flag(
                "--index-clickhouse",
                "stored state the router's index starts from: http(s)://... or chdb:///path "
                "(default: none, read the topic from its beginning)",
                metavar="URL",
            ),
        ],
    )
    add_feed_options(embedded)
    add_security_options(parser)
    add_flags(
        parser,
        [
            *listen_flags(DEFAULTS.host, DEFAULTS.port, TOKEN_ENV),
            Flag(
                "--index-token",
                f"bearer token of the index (default: ${INDEX_TOKEN_ENV}, else none)",
            ),
            Flag(
                "--engine-api-key",
                f"the engines' API key (vllm serve --api-key), sent to them as a bearer token "
                f"(default: ${ENGINE_API_KEY_ENV}, else none: the client's Authorization "
                "passes through unless it was the router's --token)",
            ),
            Flag(
                "--affinity",
                "weight of cache affinity against load, 0..1: 1 = follow the cache, load only "
                "breaks ties; 0 = least loaded",
                DEFAULTS.affinity,
                float,
            ),
            Flag(
                "--tokenizer",
                "tokenize text prompts in the router with this Hugging Face tokenizer (the "
                "engines' own) instead of asking an engine's /tokenize (default: ask the "
                "engine)",
                DEFAULTS.tokenizer,
                metavar="PATH_OR_NAME",
            ),
        ],
    )
    add_flags(
        parser,
        [
            Flag(flag, what, getattr(DEFAULTS, field), kind, dest=field)
            for flag, field, kind, what in TUNING
        ],
    )
    parser.set_defaults(run=run)


def config_of(args: argparse.Namespace) -> RouteConfig:
    """The validated config of the parsed arguments."""
    return RouteConfig(
        engines=parse_engines(args.engines),
        index_url=args.index,
        embedded_index=embedded_index_of(args),
        host=args.host,
        port=args.port,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
        index_token=args.index_token or os.environ.get(INDEX_TOKEN_ENV) or None,
        engine_api_key=args.engine_api_key or os.environ.get(ENGINE_API_KEY_ENV) or None,
        affinity=args.affinity,
        tokenizer=args.tokenizer,
        connect_timeout_s=args.connect_timeout_s,
        request_timeout_s=args.request_timeout_s,
        index_timeout_s=args.index_timeout_s,
        tokenize_timeout_s=args.tokenize_timeout_s,
        down_s=args.down_s,
        health_interval_s=args.health_interval_s,
        max_body_bytes=args.max_body_bytes,
        max_hash_tokens=args.max_hash_tokens,
        eject_after=args.eject_after,
        eject_base_s=args.eject_base_s,
        eject_max_s=args.eject_max_s,
        max_ejected_share=args.max_ejected_share,
        stall_s=args.stall_s,
        max_answer_bytes=args.max_answer_bytes,
    ).validate()


def embedded_index_of(args: argparse.Namespace) -> IndexConfig | None:
    """The config of the router's own index (`--index-bootstrap-servers`), if asked for."""
    if not args.index_bootstrap_servers:
        return None
    return IndexConfig(
        kafka=KafkaSettings.from_env(args.index_bootstrap_servers, **security_flags(args)),
        topic_prefix=args.topic_prefix,
        clickhouse=args.index_clickhouse,
        hash_algo=args.hash_algo,
        hash_seed=hash_seed(args),
    )


def run(args: argparse.Namespace) -> int:
    """Validate, then route until SIGINT/SIGTERM."""
    from kvscope.route.app import load, serve

    config = config_of(args)
    load()
    from kvscope.web.server import freeze_startup_heap, listen

    listen(config.host, config.port).close()  # a taken port fails before the cold start
    snapshots = None
    where = config.index_url or "none (routing by load alone)"
    embedded = config.embedded_index
    if embedded is not None:
        from kvscope.cli.commands import one_blas_thread

        one_blas_thread()
        from kvscope.cli.commands.index import snapshot_reader
        from kvscope.route.embedded import reading
        from kvscope.serve.access import check_kafka

        snapshots = snapshot_reader(embedded.clickhouse)
        check_kafka(embedded.kafka.bootstrap_servers, embedded.kafka.security.security_protocol)
        where = reading(embedded)

    def ready(url: str) -> None:
        freeze_startup_heap()
        print(f"kvscope route: listening at {url}", flush=True)
        for spec in config.engines:
            print(f"  engine {spec.name} -> {spec.url}", flush=True)
        print(f"  index: {where}", flush=True)

    serve(config, ready, snapshots)
    print("kvscope route: stopped", file=sys.stderr)
    return 0

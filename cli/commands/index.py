"""`kvscope index`: the global prefix index routers ask which engine holds a request's prefix."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from kvscope.cli.commands.collect import add_security_options, security_flags
from kvscope.index.config import IndexConfig
from kvscope.schemas import DEFAULT_TOPIC_PREFIX

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `index` command."""
    from kvscope.index.config import DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV

    defaults = IndexConfig
    parser = subparsers.add_parser(
        "index",
        help="serve the exact, restart-proof prefix index routers score requests against",
        description=(
            "Hold every source's resident KV blocks, exactly, from kvscope's kv-events "
            "stream, and answer POST /score, POST /routed, GET /sources, GET /resident, "
            "/healthz and /metrics (docs/index.md). With --clickhouse it starts from the "
            "stored state and reads Kafka from the stored positions; without, it reads the "
            "topic from its beginning. On a chDB directory that `kvscope serve` holds, it "
            "reads through that serve. Joins no consumer group: replicas never take "
            f"partitions from each other or the collector. A non-loopback --host needs "
            f"--token (or ${TOKEN_ENV})."
        ),
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KVSCOPE_BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP),
        help="Kafka bootstrap servers (default: $KVSCOPE_BOOTSTRAP_SERVERS, else %(default)s)",
    )
    parser.add_argument(
        "--clickhouse",
        default=None,
        metavar="URL",
        help="stored state to start from: http(s)://... or chdb:///path (default: none, "
        "read the topic from its beginning)",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help="listen address (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="HTTP port, 0 = any (default: %(default)s)"
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token on every request but /healthz (default: ${TOKEN_ENV}, else none: "
        "loopback only)",
    )
    add_feed_options(parser)
    parser.add_argument(
        "--tier-weight",
        action="append",
        default=[],
        metavar="TIER=W",
        help="score per matched block held in TIER (repeatable; default: GPU=1, CPU=0.8, "
        "DISK=0.5, EXTERNAL=0.5)",
    )
    parser.add_argument(
        "--routed-ttl",
        type=float,
        default=defaults.routed_ttl_s,
        metavar="SECONDS",
        help="lifetime of a routed hint (default: %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=defaults.max_body_bytes,
        help="largest request body; larger ones get a 413 (default: %(default)s)",
    )
    add_security_options(parser)
    parser.set_defaults(run=run)


def add_feed_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The flags of an index's topic and the fleet's block hashing (`kvscope index`, and
    `kvscope route` holding its own index)."""
    parser.add_argument(
        "--topic-prefix", default=DEFAULT_TOPIC_PREFIX, help="topic prefix (default: %(default)s)"
    )
    parser.add_argument(
        "--hash-algo",
        default=IndexConfig.hash_algo,
        help="the fleet's --prefix-caching-hash-algo, to hash token ids (default: %(default)s)",
    )
    parser.add_argument(
        "--hash-seed",
        default=None,
        help="the fleet's PYTHONHASHSEED (default: $KVSCOPE_INDEX_HASH_SEED, else vLLM's "
        "default seed of the sha256 algorithms)",
    )


def hash_seed(args: argparse.Namespace) -> str | None:
    """`--hash-seed`, else `$KVSCOPE_INDEX_HASH_SEED`, else None (vLLM's default seed)."""
    return args.hash_seed or os.environ.get("KVSCOPE_INDEX_HASH_SEED") or None


def run(args: argparse.Namespace) -> int:
    """Validate, check Kafka, cold start, then serve until SIGINT/SIGTERM."""
    import asyncio

    from kvscope.common.kafka import KafkaSettings
    from kvscope.index.config import TOKEN_ENV, IndexConfig, parse_tier_weights
    from kvscope.schemas.errors import ConfigError
    from kvscope.serve.access import check_kafka

    try:
        from kvscope.index.service import IndexService
    except ImportError as exc:
        raise ConfigError(
            f"kvscope index needs {exc.name or 'its extra'}: pip install 'kvscope[index]'"
        ) from None

    config = IndexConfig(
        kafka=KafkaSettings.from_env(args.bootstrap_servers, **security_flags(args)),
        topic_prefix=args.topic_prefix,
        clickhouse=args.clickhouse,
        host=args.host,
        port=args.port,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
        tier_weights=parse_tier_weights(args.tier_weight),
        hash_algo=args.hash_algo,
        hash_seed=hash_seed(args),
        routed_ttl_s=args.routed_ttl,
        max_body_bytes=args.max_body_bytes,
    ).validate()
    snapshots = snapshot_reader(config.clickhouse)
    check_kafka(config.kafka.bootstrap_servers, config.kafka.security.security_protocol)
    service = IndexService(config, snapshots)

    def ready(service: IndexService) -> None:
        print(f"kvscope index: listening on {service.url}", flush=True)
        print(f"  started from {service.started_from}", flush=True)
        print(f"  reading {config.topic} from {config.kafka.bootstrap_servers}", flush=True)

    if service.snapshots is None:
        print(
            "kvscope index: no --clickhouse: reading the topic from its beginning "
            "(a topic whose retention dropped old records leaves sources stale)",
            flush=True,
        )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(service, ready))
    print("kvscope index: stopped", flush=True)
    return 0


async def _run(service: Any, ready: Any) -> None:
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await service.run(ready)


def snapshot_reader(url: str | None) -> Any:
    """Where an index's cold start reads (`kvscope index --clickhouse`, `kvscope route
    --index-clickhouse`): a live serve of the chDB directory, or ClickHouse."""
    if url is None:
        return None
    from kvscope.collector.storage.target import connect, parse_target
    from kvscope.index.stored import DirectReader
    from kvscope.serve.access import open_reader
    from kvscope.serve.remote import ServeClient, ServeSnapshotReader

    target = parse_target(url)
    client = open_reader(target)
    if isinstance(client, ServeClient):
        return ServeSnapshotReader(client)
    return DirectReader(client if client is not None else connect(target))

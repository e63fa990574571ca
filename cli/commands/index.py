"""`kvscope index`: the global prefix index routers ask which engine holds a request's prefix."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from kvscope.cli.commands import (
    COMMANDS,
    Flag,
    add_flags,
    add_security_options,
    listen_flags,
    one_blas_thread,
    security_flags,
)
from kvscope.index.config import IndexConfig
from kvscope.schemas import DEFAULT_TOPIC_PREFIX

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `index` command."""
    from kvscope.index.config import DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV

    defaults = IndexConfig
    parser = subparsers.add_parser(
        "index",
        help=COMMANDS["index"],
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
    service = [
        Flag(
            "--bootstrap-servers",
            "Kafka bootstrap servers (default: $KVSCOPE_BOOTSTRAP_SERVERS, else %(default)s)",
            os.environ.get("KVSCOPE_BOOTSTRAP_SERVERS", DEFAULT_BOOTSTRAP),
        ),
        Flag(
            "--clickhouse",
            "stored state to start from: http(s)://... or chdb:///path (default: none, "
            "read the topic from its beginning)",
            metavar="URL",
        ),
        *listen_flags(DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV),
    ]
    limits = [
        Flag(
            "--tier-weight",
            "score per matched block held in TIER (repeatable; default: GPU=1, CPU=0.8, "
            "DISK=0.5, EXTERNAL=0.5)",
            [],
            action="append",
            metavar="TIER=W",
        ),
        Flag("--routed-ttl", "lifetime of a routed hint", defaults.routed_ttl_s, float, "SECONDS"),
        Flag(
            "--max-body-bytes",
            "largest request body; larger ones get a 413",
            defaults.max_body_bytes,
            int,
        ),
        Flag(
            "--max-request-tokens",
            "largest /score or /routed request in token ids or block hashes; larger ones get 413",
            defaults.max_request_tokens,
            int,
            "N",
        ),
        Flag(
            "--source-idle-expiry",
            "forget a source that published nothing for this long, while the feed is "
            "current (default: never; DELETE /sources/{instance} forgets one at once)",
            type=float,
            metavar="SECONDS",
        ),
    ]
    add_flags(parser, service)
    add_feed_options(parser)
    add_flags(parser, limits)
    add_security_options(parser)
    parser.set_defaults(run=run)


def add_feed_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The flags of an index's topic and the fleet's block hashing (`kvscope index`, and
    `kvscope route` holding its own index)."""
    add_flags(
        parser,
        [
            Flag("--topic-prefix", "topic prefix", DEFAULT_TOPIC_PREFIX),
            Flag(
                "--hash-algo",
                "the fleet's --prefix-caching-hash-algo, to hash token ids",
                IndexConfig.hash_algo,
            ),
            Flag(
                "--hash-seed",
                "the fleet's PYTHONHASHSEED (default: $KVSCOPE_INDEX_HASH_SEED, else vLLM's "
                "default seed of the sha256 algorithms)",
            ),
        ],
    )


def hash_seed(args: argparse.Namespace) -> str | None:
    """`--hash-seed`, else `$KVSCOPE_INDEX_HASH_SEED`, else None (vLLM's default seed)."""
    return args.hash_seed or os.environ.get("KVSCOPE_INDEX_HASH_SEED") or None


def run(args: argparse.Namespace) -> int:
    """Validate, check Kafka, cold start, then serve until SIGINT/SIGTERM."""
    one_blas_thread()
    import asyncio

    from kvscope.common.kafka import KafkaSettings
    from kvscope.index.config import TOKEN_ENV, IndexConfig, parse_tier_weights
    from kvscope.index.errors import IndexServiceError
    from kvscope.schemas.errors import ConfigError
    from kvscope.serve.access import check_kafka

    try:
        from kvscope.index.service import IndexService
        from kvscope.web.server import freeze_startup_heap
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
        max_request_tokens=args.max_request_tokens,
        source_idle_expiry_s=args.source_idle_expiry,
    ).validate()
    snapshots = snapshot_reader(config.clickhouse)
    check_kafka(config.kafka.bootstrap_servers, config.kafka.security.security_protocol)
    service = IndexService(config, snapshots)

    def ready(service: IndexService) -> None:
        freeze_startup_heap()
        print(f"kvscope index: listening on {service.url}", flush=True)
        print(f"  started from {service.started_from}", flush=True)
        print(f"  reading {config.topic} from {config.kafka.bootstrap_servers}", flush=True)

    if service.snapshots is None:
        print(
            "kvscope index: no --clickhouse: reading the topic from its beginning "
            "(a topic whose retention dropped old records leaves sources stale)",
            flush=True,
        )
    signalled: list[int] = []
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(service, ready, signalled))
    if not signalled:  # only a signal ends it cleanly: anything else is a failure
        raise IndexServiceError("the index stopped without being asked to; see the log above")
    print("kvscope index: stopped", flush=True)
    return 0


async def _run(service: Any, ready: Any, signalled: list[int]) -> None:
    """Run the service until SIGINT/SIGTERM (noted in `signalled`); its errors propagate."""
    import asyncio
    import signal

    from kvscope.index.errors import IndexServiceError

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(signum: int) -> None:
        signalled.append(signum)
        task.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    try:
        await service.run(ready)
    except asyncio.CancelledError:
        if not signalled:
            raise IndexServiceError("the index was cancelled without a signal") from None


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
    client = _stored_state_client(target, open_reader)
    if isinstance(client, ServeClient):
        return ServeSnapshotReader(client)
    return DirectReader(client if client is not None else connect(target))


def _stored_state_client(target: Any, open_reader: Any) -> Any:
    """`open_reader(target)`, with the index's own one-line errors for a chDB directory that
    is missing or held by a process other than a `kvscope serve` it could read through."""
    from pathlib import Path

    from kvscope.schemas.errors import ConfigError
    from kvscope.serve import state as serve_state
    from kvscope.serve.access import DirectoryBusy

    if target.is_chdb and not Path(target.path).is_dir():
        raise ConfigError(
            f"no kvscope data at {target.path}: point --clickhouse at the directory "
            "`kvscope collect` or `kvscope serve` writes, or leave --clickhouse out to read "
            "the topic from its beginning"
        )
    try:
        return open_reader(target)
    except DirectoryBusy:
        pid = serve_state.holder_pid(Path(target.path))
        if pid is None:
            raise
        holder = "another process" if pid < 0 else serve_state.process_name(pid)
        raise DirectoryBusy(
            f"--clickhouse chdb://{target.path} is held by {holder}; the index reads it "
            "only for its cold start: stop that process or run `kvscope serve` on the "
            "directory (the index reads through it), then start the index again"
        ) from None

"""`kvscope simulate`: run the fleet simulator and publish what its engines would publish.

Three outputs: Kafka (`--bootstrap-servers`, through the real Kafka publisher, the same
envelopes as a real engine), ClickHouse directly (`--clickhouse URL`, rows built by the
collector's column code and inserted without Kafka: for benchmarks and quick analytics
data, not exactly-once), or nothing (`--dry-run`, only the `--truth` file, e.g. for
capacity what-if re-runs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.cli.commands import COMMANDS, Flag, add_flags
from kvscope.collector.errors import OutputError
from kvscope.collector.storage.client import Client
from kvscope.schemas import DEFAULT_TOPIC_PREFIX, ConfigError

log = logging.getLogger(__name__)

END_MARGIN_S = 5.0
"""Without --start-time the last request arrives this long before now (as in the demo):
its work finishes about then, so a query of the last N minutes sees the whole run."""
TIMESTAMP_UNITS = {"ms": 0.001, "s": 1.0, "us": 0.000001}
"""`--trace-timestamps`: seconds per unit of a trace's timestamps."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `simulate` command."""
    from kvscope.simulator.fleet import SimConfig
    from kvscope.simulator.routing import ROUTING
    from kvscope.simulator.workloads import KNOBS, WORKLOADS

    defaults = SimConfig()

    p = subparsers.add_parser(
        "simulate",
        help=COMMANDS["simulate"],
        description=(
            "Simulate N vLLM-like engines serving a workload and publish their KV events, "
            "engine stats, finished requests and KV transfers. Deterministic for a --seed. "
            "--truth writes the ground truth the analytics must reproduce (docs/simulator.md)."
        ),
    )
    knob_text = "; ".join(
        f"{name}: " + ", ".join(f"{key}={knob.default:g}" for key, knob in knobs.items())
        for name, knobs in KNOBS.items()
    )
    add_flags(
        p.add_argument_group("output (one of)"),
        [
            Flag(
                "--bootstrap-servers", "publish to these Kafka brokers, host:port (default: none)"
            ),
            Flag(
                "--clickhouse",
                "insert rows straight into this ClickHouse target URL (default: none)",
            ),
            Flag("--dry-run", "publish nothing (truth only)", action="store_true"),
        ],
    )
    add_flags(
        p,
        [
            Flag("--topic-prefix", "default: %(default)s", DEFAULT_TOPIC_PREFIX),
            Flag("--instances", "N, or e.g. 2p,2d,1b", str(len(defaults.instances))),
            Flag("--requests", "default: %(default)s", defaults.requests, int),
            Flag(
                "--rate",
                f"requests per simulated second, not for a trace (default: {defaults.rate})",
                type=float,
            ),
            Flag(
                "--workload",
                "trace replays --trace FILE",
                defaults.workload,
                choices=[*WORKLOADS, "trace"],
            ),
            Flag(
                "--trace",
                "Mooncake-format trace (JSON lines: timestamp ms, input_length, output_length, "
                "hash_ids per 512 tokens; plain or gzip) for --workload trace; its first "
                "--requests lines (default: none)",
                metavar="FILE",
            ),
            Flag(
                "--trace-block-tokens",
                "tokens one hash id of the trace stands for: 512 in Mooncake's traces, 16 in "
                f"Alibaba's Qwen blksz_16 ones (default: {defaults.trace_block_tokens})",
                type=int,
                metavar="N",
            ),
            Flag(
                "--trace-timestamps",
                "the unit of the trace's timestamps: ms in Mooncake's traces, s in Alibaba's "
                "Qwen ones (default: ms)",
                choices=list(TIMESTAMP_UNITS),
            ),
            Flag(
                "--time-scale",
                "multiply trace arrival times by this (0.5 = twice as fast; default: "
                f"{defaults.time_scale})",
                type=float,
            ),
            Flag(
                "--no-access-stream",
                "do not publish the kv-accesses stream (per request: hashes looked up, hits)",
                action="store_true",
            ),
            Flag(
                "--workload-param",
                "workload knob (repeatable); the knobs and their defaults: " + knob_text,
                [],
                action="append",
                metavar="K=V",
            ),
            Flag(
                "--routing",
                "approximate guesses from its own decisions, exact-index asks kvscope's "
                "prefix index fed with the published KV events (read back from Kafka with "
                "--bootstrap-servers, else in process), oracle reads the engines' pools "
                "(prefix-aware is its older name; docs/routing.md)",
                defaults.routing,
                choices=ROUTING,
            ),
            Flag(
                "--router-replicas",
                "approximate: router replicas, each guessing on its own, requests spread over "
                f"them in turn (default: {defaults.router_replicas})",
                type=int,
                metavar="N",
            ),
            Flag(
                "--assumed-capacity-blocks",
                "approximate: KV blocks per instance the guesser assumes (default: "
                f"{defaults.assumed_capacity_blocks}, the Gateway API inference extension's)",
                type=int,
                metavar="N",
            ),
            Flag(
                "--index-lag",
                "exact-index: simulated seconds from publishing a KV event to the index "
                f"applying it (default: {defaults.index_lag_s:g})",
                type=float,
                metavar="SECONDS",
            ),
            Flag("--seed", "default: %(default)s", defaults.seed, int),
            Flag("--capacity-blocks", "KV blocks per instance", defaults.capacity_blocks, int),
            Flag("--block-size", "tokens per block", defaults.block_size, int),
            Flag("--model", "default: %(default)s", defaults.model),
            Flag(
                "--start-time",
                "epoch seconds of simulated time 0 (default: a published run's last request "
                f"arrives {END_MARGIN_S:g} s before now, so queries up to now see the run; a "
                "dry run starts now)",
                type=float,
            ),
            Flag("--slow-pair", "make this transfer pair slow (default: none)", metavar="SRC->DST"),
            Flag(
                "--reset",
                "reset that instance's prefix cache at that simulated time (repeatable; "
                "default: none)",
                [],
                action="append",
                metavar="INSTANCE@SECONDS",
            ),
            Flag("--truth", "write the ground truth JSON here (default: not written)", type=Path),
        ],
    )
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The `SimConfig` the command-line options describe."""
    from kvscope.simulator.fleet import SimConfig, parse_instances

    params = {}
    for item in args.workload_param:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--workload-param {item!r}: use K=V")
        if key.strip() in params:
            raise ConfigError(
                f"--workload-param {key.strip()} given more than once: give each once"
            )
        try:
            params[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"--workload-param {item!r}: {value!r} is not a number") from None
    if args.workload == "trace" and args.rate is not None:
        raise ConfigError(
            "--rate does not apply to a trace: its timestamps are the arrivals (use --time-scale)"
        )
    if args.workload != "trace":
        for option, value in (
            ("--time-scale", args.time_scale),
            ("--trace-block-tokens", args.trace_block_tokens),
            ("--trace-timestamps", args.trace_timestamps),
        ):
            if value is not None:
                raise ConfigError(f"{option} applies only to --workload trace")
    for option, value, policies in (
        ("--router-replicas", args.router_replicas, ("approximate",)),
        ("--assumed-capacity-blocks", args.assumed_capacity_blocks, ("approximate",)),
        ("--index-lag", args.index_lag, ("exact-index",)),
    ):
        if value is not None and args.routing not in policies:
            raise ConfigError(f"{option} applies only to --routing {' or '.join(policies)}")
    resets = []
    for item in args.reset:
        name, sep, at = item.rpartition("@")
        if not sep:
            raise ConfigError(f"--reset {item!r}: use INSTANCE@SECONDS")
        try:
            resets.append((name, float(at)))
        except ValueError:
            raise ConfigError(f"--reset {item!r}: {at!r} is not a number of seconds") from None
    given = {  # flags without a default: SimConfig's applies
        name: value
        for name, value in (
            ("rate", args.rate),
            ("time_scale", args.time_scale),
            ("trace_block_tokens", args.trace_block_tokens),
            ("start_ts", args.start_time),
            ("router_replicas", args.router_replicas),
            ("assumed_capacity_blocks", args.assumed_capacity_blocks),
            ("index_lag_s", args.index_lag),
        )
        if value is not None
    }
    if args.trace_timestamps is not None:
        given["trace_timestamp_s"] = TIMESTAMP_UNITS[args.trace_timestamps]
    return SimConfig(
        instances=parse_instances(args.instances),
        workload=args.workload,
        requests=args.requests,
        workload_params=params,
        routing=args.routing,
        seed=args.seed,
        capacity_blocks=args.capacity_blocks,
        block_size=args.block_size,
        model=args.model,
        slow_pair=args.slow_pair,
        resets=tuple(resets),
        trace=args.trace,
        access_stream=not args.no_access_stream,
        **given,
    )


def start_ending_now(requests: Sequence[Any]) -> float:
    """The whole minute at which the last of `requests` arrives at least `END_MARGIN_S`
    before now (starting at now stamped the run's records up to its span in the future,
    where queries, reading up to now by default, did not see them yet; a whole minute, so
    one seed gives the same per-minute series on every run)."""
    from kvscope.analytics.times import whole_minute_before

    last = max((r.arrival_s for r in requests), default=0.0)
    start = whole_minute_before(time.time() - last - END_MARGIN_S)
    if start < 0:
        raise ConfigError(
            f"the run spans {last:.4g} simulated seconds, more than have passed since "
            "1970, so it cannot end now: give --start-time, or shorten the run (--time-scale "
            "for a trace, --rate otherwise)"
        )
    return start


class _Progress:
    """Prints `done/total` requests on stderr at most every 2 s (and at the end)."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - self._last >= 2.0:
            self._last = now
            print(f"simulate: {done}/{total} requests", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Simulate, publish to the chosen output, write the truth."""
    from kvscope.collector.pipeline.direct_sink import DirectSink
    from kvscope.simulator.fleet import Fleet, workload_requests
    from kvscope.simulator.sinks import KafkaSink

    outputs = [bool(args.bootstrap_servers), bool(args.clickhouse), args.dry_run]
    if sum(outputs) != 1:
        raise ConfigError("give exactly one of --bootstrap-servers, --clickhouse, --dry-run")
    config = config_from_args(args)
    config.validate()
    if args.truth:
        check_writable(args.truth)
    client = None
    sink: Any = None
    index: Any = None
    if args.bootstrap_servers:
        from kvscope.publisher.config import PublisherConfig
        from kvscope.serve.access import check_kafka

        # Only a TCP connection is checked: like the engines it plays, simulate publishes
        # to a broker that does not answer and counts what it loses.
        check_kafka(args.bootstrap_servers, probe=False)
        # KVSCOPE_* publisher settings apply (security, timeouts, sizes), as in an engine.
        settings = PublisherConfig.from_env()
        sink = KafkaSink(args.bootstrap_servers, args.topic_prefix, settings)
        if config.routing == "exact-index":  # kvscope's index reads the records back
            from kvscope.common.kafka import KafkaSettings
            from kvscope.simulator.broker_index import BrokerIndex

            kafka = KafkaSettings.from_env(args.bootstrap_servers)
            index = BrokerIndex(kafka.validate(), args.topic_prefix)
    elif args.clickhouse:
        from kvscope.collector.storage.migrate import migrate
        from kvscope.collector.storage.target import connect, parse_target

        target = parse_target(args.clickhouse)
        client = connect(target)
        migrate(client, target)
        check_new_sources(client, config)
        sink = DirectSink(client, args.topic_prefix)
    try:
        requests = workload_requests(config)
        if args.start_time is None and sink is not None:
            config.start_ts = start_ending_now(requests)
        truth = Fleet(config, sink, progress=_Progress(), index=index).run(requests)
    finally:
        if index is not None:
            index.close()
        delivered = sink.close() if sink is not None else True
        if client is not None:
            client.close()
    if args.truth:
        try:
            args.truth.write_text(json.dumps(truth, indent=1, allow_nan=False))
        except OSError as exc:
            raise OutputError(f"cannot write the truth to {args.truth}: {exc.strerror}") from exc
    fleet = truth["fleet"]
    print(
        f"simulate: {fleet['requests_finished']} request completions, "
        f"{fleet['stored_blocks']} blocks stored, hit rate {fleet['hit_rate']:.4f}"
    )
    if isinstance(sink, KafkaSink):
        lost = sink.lost()
        if lost or not delivered:
            print(f"kvscope simulate: error: {lost_line(sink.sent, lost, args)}", file=sys.stderr)
            return 1
    return 0


def check_new_sources(client: Client, config: Any) -> None:
    """`ConfigError` when the database already holds records of this run's sources.

    A source's epoch comes from the seed and its name, so a second run with the same
    --seed writes the same sources and seqs again (with other times): its rows would mix
    with the first run's into one garbled history (negative residency durations).
    """
    from kvscope.collector.storage.tables import ENGINE_STATS
    from kvscope.simulator.fleet import source_epoch

    epochs = [source_epoch(config.seed, i.name) for i in config.instances]
    result = client.query(
        f"SELECT DISTINCT instance FROM {ENGINE_STATS.name} "
        "WHERE epoch IN {epochs:Array(UInt64)} "
        "ORDER BY instance",
        parameters={"epochs": epochs},
    )
    held = [row[0] for row in result.result_rows]
    if held:
        raise ConfigError(
            f"the database already holds a simulated run with --seed {config.seed} "
            f"({', '.join(held)}); a second one would mix into its history: "
            "give another --seed or another database"
        )


def check_writable(path: Path) -> None:
    """`OutputError` unless `path` can be written (checked before a long run, not after)."""
    if path.is_dir():
        raise OutputError(f"cannot write the truth to {path}: it is a directory")
    if not path.parent.is_dir():
        raise OutputError(f"cannot write the truth to {path}: no directory {path.parent}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise OutputError(f"cannot write the truth to {path}: permission denied")


LOST_ADVICE = {
    "too_large": "raise KVSCOPE_MAX_REQUEST_SIZE (and the topics' max.message.bytes)",
    "queue_full": "raise KVSCOPE_QUEUE_SIZE",
}
"""What to do about records lost for a reason; any other reason means Kafka did not take them."""


def lost_line(sent: int, lost: dict[str, int], args: argparse.Namespace) -> str:
    """One line: how many of the records sent were lost, why, and what to do."""
    total = sum(lost.values())
    if not total:
        return (
            f"Kafka at {args.bootstrap_servers} did not confirm all {sent:,} records in time; "
            "check the broker and run again"
        )
    reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(lost.items()))
    advice = sorted({LOST_ADVICE.get(reason, "") for reason in lost} - {""})
    if set(lost) - set(LOST_ADVICE):
        advice.append(
            f"check that Kafka at {args.bootstrap_servers} runs and is reachable, then run again"
        )
    return f"{total:,} of {sent:,} records were lost ({reasons}); {'; '.join(advice)}"

"""`kvscope report`: write the offline capacity-planning report (HTML, Markdown, JSON)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kvscope.analytics.numbers import milliseconds, share
from kvscope.analytics.times import parse_time
from kvscope.cli.commands import COMMANDS
from kvscope.collector.storage.target import add_clickhouse_argument
from kvscope.schemas.errors import ConfigError


def _argument(parse: Callable[[str], float]) -> Callable[[str], float]:
    """`parse` as an argparse type: its ValueError becomes the usage error it words."""

    def convert(text: str) -> float:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


SIZING_LIMITS = {"gpu_gib": 4096.0, "prefill_tokens_per_gpu_s": 1e9, "usd_per_gpu_hour": 1e5}
"""The largest value each sizing flag accepts: beyond them it is a typo, not a GPU."""
MODEL_LIMITS = {"--kv-layers": 4096, "--kv-heads": 4096, "--head-dim": 65536, "--kv-dtype-bytes": 8}
"""The largest model dimension each flag accepts: beyond them it is a typo, not a model."""


def _whole(flag: str, least: int, most: int) -> Callable[[str], int]:
    """An argparse type for `flag`: a whole number in least..most, else a usage error
    naming the range."""

    def convert(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = least - 1
        if not least <= number <= most:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number {least}..{most}")
        return number

    return convert


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """The report flags shared by `kvscope report` and `kvscope demo`."""
    parser.add_argument(
        "--target-hit-rate",
        type=_argument(share),
        default=0.7,
        metavar="SHARE",
        help="hit rate the capacity recommendation aims for, 0..1 or %% (default: %(default)s)",
    )
    parser.add_argument(
        "--transfer-slo-ms",
        type=_argument(milliseconds),
        default=50.0,
        metavar="MS",
        help="KV-transfer latency SLO; slower transfers count as breaches (default: %(default)s)",
    )
    sizing = parser.add_argument_group(
        "sizing (capacity in GiB and GPUs, savings in GPU time; all optional)"
    )
    sizing.add_argument(
        "--model-config",
        metavar="FILE",
        help="Hugging Face config.json of the served model (default: none)",
    )
    for flag, what in (
        ("--kv-layers", "layers"),
        ("--kv-heads", "KV heads"),
        ("--head-dim", "head dimension"),
    ):
        sizing.add_argument(
            flag,
            type=_whole(flag, 1, MODEL_LIMITS[flag]),
            metavar="N",
            help=f"model {what} (instead of a config; default: from --model-config)",
        )
    sizing.add_argument(
        "--kv-dtype-bytes",
        type=_whole("--kv-dtype-bytes", 1, MODEL_LIMITS["--kv-dtype-bytes"]),
        metavar="N",
        help="bytes per KV element (default: from --model-config's torch_dtype, else 2)",
    )
    sizing.add_argument(
        "--gpu-gib",
        type=float,
        metavar="GIB",
        help="KV memory per GPU, GiB (default: none, no GPU counts)",
    )
    sizing.add_argument(
        "--prefill-tokens-per-gpu-s",
        type=float,
        metavar="N",
        help="prefill throughput of one GPU, to express savings as GPU-seconds per hour "
        "(default: measured from the stored requests' prefill times, when they have them)",
    )
    sizing.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        metavar="USD",
        help="what one GPU costs per hour, to price GPUs added and prefill saved "
        "(default: none, no prices)",
    )
    sizing.add_argument(
        "--min-transfers",
        type=_whole("--min-transfers", 0, 10**9),
        default=20,
        metavar="N",
        help="transfers a pair needs before a finding judges it (default: %(default)s)",
    )


def sizing_from_args(args: argparse.Namespace) -> dict:
    """The report's optional sizing parameters from the flags (see `add_report_options`)."""
    from kvscope.analytics.report import sizing

    dims = (args.kv_layers, args.kv_heads, args.head_dim)
    per_token = None
    if args.model_config:
        per_token = sizing.from_model_config(args.model_config, args.kv_dtype_bytes)
    elif any(d is not None for d in dims):
        if None in dims:
            raise ConfigError("give all of --kv-layers, --kv-heads, --head-dim (or --model-config)")
        dtype_bytes = 2 if args.kv_dtype_bytes is None else args.kv_dtype_bytes
        per_token = sizing.kv_bytes_per_token(*dims, dtype_bytes)
    for name, most in SIZING_LIMITS.items():
        value = getattr(args, name)
        if value is not None and not 0 < value <= most:
            raise ConfigError(f"--{name.replace('_', '-')} must be a number > 0 and <= {most:g}")
    return {
        "kv_bytes_per_token": per_token,
        "gpu_gib": args.gpu_gib,
        "prefill_tokens_per_gpu_s": args.prefill_tokens_per_gpu_s,
        "usd_per_gpu_hour": args.usd_per_gpu_hour,
        "min_transfers": args.min_transfers,
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` command."""
    parser = subparsers.add_parser(
        "report",
        help=COMMANDS["report"],
        description=(
            "Read kvscope's tables and write a capacity-planning report into --out: "
            "report.html (self-contained, opens from disk), report.md with images/, and "
            "report.json with every figure. Built on the same queries as `kvscope query`."
        ),
    )
    add_clickhouse_argument(parser)
    parser.add_argument(
        "--since",
        metavar="T",
        help="start of the window: ISO 8601, epoch seconds or a duration ago like 2h "
        "(default: the first stored row)",
    )
    parser.add_argument("--until", metavar="T", help="end of the window (default: now)")
    parser.add_argument("--model", metavar="M", help="only this model (default: all)")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="kvscope-report",
        help="output directory (default: %(default)s)",
    )
    add_report_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Gather the figures, render, write; print where the report is."""
    import contextlib

    from kvscope.analytics.report.build import build_report
    from kvscope.analytics.report.progress import terminal_progress
    from kvscope.analytics.report.write import check_out_dir
    from kvscope.collector.storage.target import parse_target
    from kvscope.serve.access import open_reader

    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    if since and until and since >= until:
        raise ConfigError("--since must be before --until")
    now = datetime.now(UTC)
    if since and not until and since >= now:
        raise ConfigError(
            f"--since {args.since} is in the future (now {now:%Y-%m-%d %H:%M} UTC): give a "
            "start before now, or an --until after it"
        )
    target = parse_target(args.clickhouse)
    out = Path(args.out)
    check_out_dir(out)
    sizing = sizing_from_args(args)  # bad sizing flags fail before the database is opened
    client = open_reader(target)
    with contextlib.closing(client), terminal_progress() as progress:
        _, files = build_report(
            target,
            out,
            since=since,
            until=until,
            model=args.model,
            target_hit_rate=args.target_hit_rate,
            transfer_slo_ms=args.transfer_slo_ms,
            sizing=sizing,
            progress=progress,
            client=client,
        )
    print(f"kvscope report: {files.html}")
    print(f"  also {files.markdown.name} and {files.json.name} in {files.html.parent}")
    return 0

"""`kvscope trace export`: the stored access stream as a Mooncake-format trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvscope.cli.commands import COMMANDS
from kvscope.collector.storage.target import add_clickhouse_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `trace` command and its `export` subcommand."""
    p = subparsers.add_parser(
        "trace",
        help=COMMANDS["trace"],
        description="Work with request traces built from the access stream (kv-accesses).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser(
        "export",
        help="write the access stream of a window as a Mooncake-format trace",
        description=(
            "Write the requests of the stored access stream as a Mooncake-format trace "
            "(JSON lines: timestamp in ms from the first arrival, input_length, "
            "output_length, hash_ids per full prompt block). Engine block hashes are "
            "replaced by dense integers, so none leaves; one hash id stands for the "
            "engine's block size, printed with the command that replays the trace in "
            "`kvscope simulate --workload trace`. A P/D fleet's decode-side lookups are "
            "left out (each request appears once). docs/analytics.md, 'Trace export'."
        ),
    )
    add_clickhouse_argument(export)
    export.add_argument(
        "--since",
        metavar="T",
        help="start of the window: ISO 8601, epoch seconds or a duration ago like 2h "
        "(default: the first stored access)",
    )
    export.add_argument("--until", metavar="T", help="end of the window (default: now)")
    export.add_argument("--instance", metavar="I", help="only this instance (default: all)")
    export.add_argument("--model", metavar="M", help="only this model (default: all)")
    export.add_argument(
        "--out", metavar="FILE", required=True, type=Path, help="trace file to write (required)"
    )
    export.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    """Read the window's accesses, write the trace, say how to replay it."""
    from kvscope.analytics import queries
    from kvscope.analytics.report.write import check_out_file
    from kvscope.analytics.trace_export import trace_lines, write_lines
    from kvscope.collector.errors import OutputError
    from kvscope.collector.storage.target import parse_target
    from kvscope.serve.access import open_reader

    given = {
        "since": args.since or "1970-01-01T00:00:00",
        "instance": args.instance or "",
        "model": args.model or "",
    }
    if args.until:
        given["until"] = args.until
    params = queries.bind_params(queries.load_query("trace_requests"), given)
    check_out_file(args.out)
    client = open_reader(parse_target(args.clickhouse))
    try:
        rows = queries.run_query(client, "trace_requests", params)
    finally:
        client.close()
    lines, summary = trace_lines(rows)
    try:
        with open(args.out, "w", encoding="utf-8") as out:
            write_lines(lines, out)
    except OSError as exc:
        raise OutputError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    bs = summary.block_size
    print(
        f"wrote {summary.requests} requests over {summary.span_s:.1f} s to {args.out} "
        f"(Mooncake format, timestamps in ms, {summary.distinct_ids} distinct hash ids of "
        f"{bs} tokens each); replay it with: kvscope simulate --workload trace --trace "
        f"{args.out} --requests {summary.requests} --instances {summary.sources} "
        f"--trace-block-tokens {bs} --block-size {bs} --capacity-blocks N",
        file=sys.stderr,
    )
    return 0

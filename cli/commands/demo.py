"""`kvscope demo`: broker, collector, simulated fleet and report on one machine."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from kvscope.cli.commands import COMMANDS, stop_on_sigterm
from kvscope.cli.commands.report import add_report_options, sizing_from_args

if TYPE_CHECKING:
    from kvscope.local.demo import DemoResult


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `demo` command."""
    parser = subparsers.add_parser(
        "demo",
        help=COMMANDS["demo"],
        description=(
            "Start a local Kafka-protocol broker, store into embedded ClickHouse (chDB) under "
            "--out, run the collector, publish a simulated fleet (prefill and decode "
            "instances, shared-prefix workload, one slow transfer pair, small caches), wait "
            "until everything is stored, and write the capacity-planning report. A live "
            "dashboard (kvscope serve) shows the data while it arrives (with --pace, at a real "
            "pace); its URL is printed. "
            "Stops everything it started when done (or, with --keep-serving, on Ctrl-C)."
        ),
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="kvscope-demo",
        help="output directory (default: %(default)s)",
    )
    parser.add_argument(
        "--scale",
        choices=["small", "default"],
        default="default",
        help="fleet and workload size; small is for CI (default: %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="port of the local broker (default: a free port on 127.0.0.1)",
    )
    parser.add_argument("--seed", type=int, default=7, help="simulator seed (default: %(default)s)")
    parser.add_argument(
        "--engine",
        choices=["simulator", "vllm", "vllm-pd"],
        default="simulator",
        help=(
            "simulator (default): a simulated prefill/decode fleet; vllm: two real vLLM "
            "engines; vllm-pd: a real prefill->decode vLLM pair over NIXL, so the report's "
            "transfer section comes from real hand-offs (vllm and vllm-pd need vLLM "
            "installed and --model-path; vllm-pd also NIXL: pip install 'kvscope[pd]' && pip "
            "install --no-deps nixl==1.5.1)"
        ),
    )
    parser.add_argument(
        "--model-path",
        metavar="DIR",
        default=None,
        help="Hugging Face model folder for --engine vllm/vllm-pd, a small model: it runs on "
        "CPU (default: none)",
    )
    parser.add_argument(
        "--engine-start-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a real engine (--engine vllm/vllm-pd) may take to start before the demo "
        "gives up; a slow machine loading a larger model needs more (default: 180 for vllm, "
        "900 for vllm-pd)",
    )
    parser.add_argument(
        "--serve-port",
        type=int,
        default=None,
        help="port of the live dashboard (default: 8765, or any free port when it is taken)",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=None,
        metavar="X",
        help="publish the simulated fleet at X simulated seconds per wall second, so the "
        "dashboard shows it arriving live (1 = real time: --scale small takes 12 minutes, "
        "default 25); Ctrl-C then ends the publishing early and still writes the report "
        "(default: as fast as possible)",
    )
    parser.add_argument(
        "--keep-serving",
        action="store_true",
        help="after the report, keep the dashboard, collector and broker running until "
        "Ctrl-C (default: stop when done)",
    )
    add_report_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo with progress on stderr; print where the report is and what it found."""
    import contextlib
    import threading
    from pathlib import Path

    from kvscope.analytics.report.progress import terminal_progress
    from kvscope.local.demo import DemoOptions, run_demo

    stop_on_sigterm()
    if args.log_level == "INFO":
        # Progress bars replace the services' start/stop log lines (--log-level DEBUG shows all).
        logging.getLogger().setLevel(logging.WARNING)
    options = DemoOptions(
        out_dir=Path(args.out),
        scale=args.scale,
        broker_port=args.port,
        target_hit_rate=args.target_hit_rate,
        transfer_slo_ms=args.transfer_slo_ms,
        seed=args.seed,
        engine=args.engine,
        model_path=Path(args.model_path) if args.model_path else None,
        engine_start_timeout_s=args.engine_start_timeout,
        sizing=sizing_from_args(args),
        serve_port=args.serve_port,
        pace=args.pace,
    )

    def announce(url: str) -> None:
        print(f"kvscope demo: live dashboard at {url}/", flush=True)
        if args.pace is not None:
            notice(
                f"publishing at {args.pace:g} simulated seconds per second; Ctrl-C ends the "
                "publishing and still stores what was published and writes the report"
            )

    def notice(text: str) -> None:
        print(f"kvscope demo: {text}", file=sys.stderr, flush=True)

    def hold(result: DemoResult) -> None:
        summarize(result)
        live = "" if args.pace is not None else " Add --pace 1 to watch the fleet arrive live."
        print(
            f"\nStill serving the dashboard at {result.dashboard_url}/ (and `kvscope query`"
            f" reads through it); press Ctrl-C to stop.{live}",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()

    with terminal_progress() as progress:
        result = run_demo(
            options,
            progress,
            on_serving=announce,
            hold=hold if args.keep_serving else None,
            notice=notice,
        )
    if not args.keep_serving:
        summarize(result)
    return 0


def summarize(result: DemoResult) -> None:
    """Print what the demo did, where the report is, and its three main findings."""
    from kvscope.analytics.queries import terminal_safe

    print(
        f"\nkvscope demo: done in {result.elapsed_s:.0f} s; "
        f"{result.stored:,} of {result.published:,} published records stored."
    )
    print(f"Report: {result.files.html.resolve()}")
    print(f"        {result.files.markdown.resolve()} and {result.files.json.name} beside it")
    print("\nThree most important findings:")
    for number, finding in enumerate(result.findings, 1):
        print(f"  {number}. {terminal_safe(finding)}")
    print(
        f"\nQuery the data yourself: kvscope query --list; kvscope query NAME "
        f"--clickhouse '{result.clickhouse_url}'"
    )
    sys.stdout.flush()

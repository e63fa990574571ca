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
from collections.abc import Callable
from typing import Any

_swallowed = threading.Event()


class _NotingHook:
    """`sys.unraisablehook` noting a swallowed `KeyboardInterrupt`; every other unraisable
    exception goes to the hook it replaced."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        exc_type = unraisable.exc_type
        if isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):
            _swallowed.set()
            return
        self.previous(unraisable)


def note_swallowed_interrupts() -> None:
    """Start noting swallowed interrupts afresh (one command run): install the hook once
    per process, however many commands `main` runs in it, and forget earlier notes."""
    _swallowed.clear()
    if not isinstance(sys.unraisablehook, _NotingHook):
        sys.unraisablehook = _NotingHook(sys.unraisablehook)


def swallowed_interrupt() -> bool:
    """Whether a Ctrl-C was swallowed inside a finalizer since the run began noting."""
    return _swallowed.is_set()


def forget_caught_interrupt_mark() -> None:
    """Clear CPython's "die by SIGINT at exit" mark once `main` has handled a Ctrl-C.

    CPython (3.11 at least) sets that mark whenever an `exec()` of source text ends in
    `KeyboardInterrupt`, caught or not, and `python -m` obeys it after the interpreter
    finalizes: a Ctrl-C landing while a dataclass or namedtuple builds its methods (during
    a lazy import) turned `python -m kvscope.cli`'s exit code 130 into death by SIGINT
    (-2), one run in three of the demo's Ctrl-C test. Every `exec()` of text clears the
    mark when it starts and sets it only if it ends interrupted, so one that runs nothing
    clears it, on any version, without reaching into the interpreter's internals.
    """
    exec("pass", {})  # a fixed, empty program: see above

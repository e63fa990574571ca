"""Ctrl-C that Python swallowed is delivered again.

A SIGINT whose `KeyboardInterrupt` is raised while a finalizer runs (an object's
`__del__`, a weakref callback, as asyncio's transports have) cannot propagate: Python
prints "Exception ignored in ..." and the command runs on as if no key was pressed. The
`kvscope demo` showed it under load: a Ctrl-C during its start-up ended in exit 0 after
the whole run. `deliver_swallowed_interrupts` makes such an interrupt a real one again.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

REDELIVER_AFTER_S = 0.001
"""The signal is sent again from a timer thread this long after the finalizer ended, so
the main thread meets it outside the finalizer (were it inside one again, it repeats). It
goes to the main thread itself: sent to the process, the kernel may hand it to another
thread and leave the main thread asleep in a system call."""


def deliver_swallowed_interrupts() -> None:
    """Install a `sys.unraisablehook` that sends SIGINT again for a swallowed
    `KeyboardInterrupt` and leaves every other unraisable exception to the hook before it."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        exc_type = unraisable.exc_type
        if isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):
            main = threading.main_thread().ident
            threading.Timer(REDELIVER_AFTER_S, signal.pthread_kill, (main, signal.SIGINT)).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook

"""Child processes handled the same way everywhere: stopping them (broker, demo engines,
test browsers) and waiting for an HTTP server child to answer (vLLM API servers)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.collector.errors import EngineError


def stop_process(process: subprocess.Popen[Any], grace_s: float) -> None:
    """Terminate `process`, kill it if it is still running after `grace_s`; reap it.

    Does nothing when the process has already exited, so it is safe to call twice.
    """
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_healthy(server: subprocess.Popen[Any], base_url: str, log: Path, timeout_s: float) -> None:
    """Poll `base_url`/health until it answers; `EngineError` with the end of `log` if the
    server exits first or does not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise EngineError(f"{base_url} exited while starting:\n{log_tail(log)}")
        try:
            urllib.request.urlopen(f"{base_url}/health", timeout=2).close()
            return
        except OSError:
            time.sleep(0.3)
    raise EngineError(f"{base_url} not healthy after {timeout_s:.0f}s:\n{log_tail(log)}")


def log_tail(log: Path, chars: int = 4000) -> str:
    """The last `chars` characters of a server's log, to say why it failed ("" if unreadable)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


PR_SET_PDEATHSIG = 1
"""Linux prctl option: a signal the kernel sends this process when its parent dies."""


def parent_death_signal(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` making the child get `signum` when the process that started it dies.

    So a `kvscope broker` or `kvscope demo` killed with SIGKILL (no cleanup runs) does not
    leave its broker running. Linux only (elsewhere it does nothing); the signal follows
    the thread that started the child, so start children from a long-lived thread.
    """
    parent = os.getpid()

    def arm() -> None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm

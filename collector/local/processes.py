"""Stopping child processes the same way everywhere (broker, demo engines, test browsers)."""

from __future__ import annotations

import subprocess
from typing import Any


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

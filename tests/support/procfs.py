"""Process-tree checks from Linux /proc, for tests that a command leaves no process behind."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def child_pids(pid: int) -> list[int]:
    """Direct child process ids of `pid`, sorted."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = task / "children"
        if children.exists():
            found |= {int(c) for c in children.read_text().split()}
    return sorted(found)


def is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_children(process: subprocess.Popen[Any], timeout_s: float = 60) -> list[int]:
    """The child pids of a running `process`, polled until it has some (or timeout / exit)."""
    deadline = time.monotonic() + timeout_s
    children: list[int] = []
    while not children and time.monotonic() < deadline and process.poll() is None:
        children = child_pids(process.pid)
        time.sleep(0.05)
    return children


@contextmanager
def killed_on_exit(process: subprocess.Popen[Any]) -> Iterator[subprocess.Popen[Any]]:
    """`process`, SIGKILLed and reaped on leaving if it still runs (a failed check inside
    must not leave it behind; `Popen`'s own exit would wait for it instead)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

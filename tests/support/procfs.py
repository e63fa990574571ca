"""Process-tree checks from Linux /proc, for tests that a command leaves no process behind."""

from __future__ import annotations

from pathlib import Path


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

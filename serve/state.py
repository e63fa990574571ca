"""Who holds an embedded chDB directory, and the record a live `kvscope serve` leaves in it.

chDB allows one process per data directory. `kvscope serve` writes `.kvscope-serve.json`
(its URL, pid and token, mode 0600) into the directory it holds, so `kvscope query` and
`kvscope report` can ask it instead of opening the directory themselves. Any other holder
(a `kvscope collect`, a notebook) is named by the pid ClickHouse writes into the `status`
file it locks, so the user gets one line saying which process to stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_ENV = "KVSCOPE_SERVE_TOKEN"
"""Environment variable holding the serve's token (for `serve` and for readers)."""
STATE_FILE = ".kvscope-serve.json"
"""The record of a live serve, inside the chDB directory it holds."""
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
STATUS_FILE = "status"
"""ClickHouse's lock file: locked (flock) while a process has the directory open."""


@dataclasses.dataclass(frozen=True)
class ServeState:
    """Where a live `kvscope serve` answers, and how to authenticate."""

    url: str
    """Base URL, e.g. `http://127.0.0.1:8765` (a connectable address, never 0.0.0.0)."""
    pid: int
    """The serve's process id."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token the serve requires (None: loopback without a token)."""
    database: str = ""
    """The database it serves ('' in a record of an older serve: not known)."""


def write_state(directory: Path, state: ServeState) -> Path:
    """Record `state` in `directory` (mode 0600: the token is a secret)."""
    path = Path(directory) / STATE_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(state), handle)
    return path


def remove_state(directory: Path, pid: int | None = None) -> None:
    """Delete the record, but only one this process (or `pid`) wrote."""
    path = Path(directory) / STATE_FILE
    state = read_state(directory)
    if state is not None and state.pid == (pid or os.getpid()):
        path.unlink(missing_ok=True)


def read_state(directory: Path) -> ServeState | None:
    """The recorded serve of `directory`, or None (no record, or an unreadable one)."""
    try:
        data = json.loads((Path(directory) / STATE_FILE).read_text(encoding="utf-8"))
        return ServeState(
            url=str(data["url"]),
            pid=int(data["pid"]),
            token=data.get("token"),
            database=str(data.get("database") or ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    """True when a process with this id exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0] != "Z"
    return True


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True when `url/healthz` answers 200 (the health check needs no token)."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as reply:
            return reply.status == 200
    except OSError:
        return False


def live_serve(directory: Path) -> ServeState | None:
    """The serve holding `directory` if its record names a running, answering process."""
    state = read_state(directory)
    if state is None or not pid_alive(state.pid):
        return None
    return state if healthy(state.url) else None


def holder_pid(directory: Path) -> int | None:
    """The pid of another process holding the chDB `directory`, or None when it is free.

    Tries ClickHouse's own lock on `status` without waiting (and releases it at once);
    this process holding the directory (tests, the demo) counts as free.
    """
    status = Path(directory) / STATUS_FILE
    try:
        handle = open(status, "rb")  # noqa: SIM115 (closed below, after the lock test)
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _status_pid(handle.read().decode(errors="replace"))
            if pid == os.getpid():
                return None
            return pid if pid is not None else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _redacted(words: list[str]) -> list[str]:
    """Command-line words with tokens and URL passwords masked (error messages are shown)."""
    out: list[str] = []
    for word in words:
        if out and out[-1] == "--token":
            word = "***"
        elif word.startswith("--token="):
            word = "--token=***"
        out.append(_URL_PASSWORD.sub(r"\1***@", word))
    return out


def _status_pid(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "PID" and value.strip().isdigit():
            return int(value.strip())
    return None


def process_name(pid: int) -> str:
    """A short description of process `pid` (its command line), for error messages."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    text = " ".join(_redacted(words))
    shown = text if len(text) <= 80 else text[:77] + "..."
    return f"pid {pid} ({shown.encode('ascii', 'replace').decode()})" if shown else f"pid {pid}"

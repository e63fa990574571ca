"""A `kvscope index` subprocess for tests, and reading its whole state over HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from support.serve_kit import KVSCOPE, terminate

T = TypeVar("T")


class IndexProcess:
    """`kvscope index` on a free port; its log goes to `log_path`."""

    def __init__(
        self, bootstrap_servers: str, topic_prefix: str, log_path: Path, *extra: str
    ) -> None:
        self.args = [
            "index",
            "--bootstrap-servers",
            bootstrap_servers,
            "--topic-prefix",
            topic_prefix,
            "--port",
            "0",
            *extra,
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = next((extra[i + 1] for i, a in enumerate(extra) if a == "--token"), None)

    def start(self, timeout_s: float = 120) -> IndexProcess:
        """Start and wait for the line naming its URL."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [*KVSCOPE, *self.args], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"listening on (\S+)", self.output())
            if found:
                self.url = found.group(1)
                return self
            if self.process.poll() is not None:
                raise AssertionError(f"kvscope index exited early:\n{self.output()}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"kvscope index did not start:\n{self.output()}")

    def output(self) -> str:
        """What the process printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """GET (or POST `body` as JSON) `path`: status and parsed JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        token = self.token if token is None else token
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                raw = reply.read()
                status = reply.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def state(self) -> dict[tuple[str, int], tuple[set[int], bool]]:
        """Every source's resident hashes (all pages) and stale flag."""
        status, sources = self.request("/sources")
        assert status == 200, sources
        out = {}
        for row in sources:
            hashes: set[int] = set()
            after = ""
            while True:
                path = f"/resident?instance={row['instance']}&dp_rank={row['dp_rank']}&limit=500"
                status, page = self.request(path + (f"&after={after}" if after else ""))
                assert status == 200, page
                hashes.update(page["hashes"])
                if page["next"] is None:
                    break
                after = page["next"]
            out[(row["instance"], row["dp_rank"])] = (hashes, row["stale"])
        return out

    def kill(self) -> None:
        """SIGKILL (no chance to clean up)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        return terminate(self.process)


def wait_for(check: Callable[[], T], what: str, timeout_s: float = 60, every_s: float = 0.05) -> T:
    """`check()`'s first truthy answer, asked every `every_s`; fails naming `what` after
    `timeout_s` (a bound on a hang, not a timed assertion)."""
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)
    return got

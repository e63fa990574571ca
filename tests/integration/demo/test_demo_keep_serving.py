"""`kvscope demo --keep-serving`: after the report the dashboard stays up, queries read
through it, and Ctrl-C stops everything (serve record removed, broker gone)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kvscope.serve.state import read_state
from support.procfs import child_pids, is_running


def test_keep_serving_until_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", "demo", "--scale", "small", "--out",
         str(out), "--serve-port", "0", "--keep-serving"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        lines: list[str] = []
        while not any(line.startswith("Still serving") for line in lines):
            line = demo.stdout.readline()
            assert line, f"the demo ended before it said it keeps serving:\n{''.join(lines)}"
            lines.append(line)
        url = next(line.split(" at ")[1].strip() for line in lines if "live dashboard at" in line)
        state = read_state(out / "chdb")
        assert state is not None and state.pid == demo.pid and url.startswith(state.url)
        children = child_pids(demo.pid)
        assert children, "no broker child"
        with urllib.request.urlopen(f"{state.url}/api/query/hit_rate", timeout=60) as reply:
            api = json.loads(reply.read())["rows"]
        query = subprocess.run(
            [sys.executable, "-m", "kvscope.cli", "query", "hit_rate", "--clickhouse",
             f"chdb://{out / 'chdb'}?database=kvscope", "--format", "json"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert query.returncode == 0, query.stderr
        rows = json.loads(query.stdout)
        assert [r["instance"] for r in rows] == [r["instance"] for r in api]
        assert rows[-1]["instance"] == "*" and rows[-1]["prefix_queries"] > 0
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert read_state(out / "chdb") is None, "the serve record outlived the demo"
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if is_running(pid)], "the broker outlived the demo"
    assert (out / "report.html").is_file()

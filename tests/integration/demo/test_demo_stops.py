"""`kvscope demo` stops everything it started on Ctrl-C, and explains a busy port."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.procfs import child_pids, is_running, killed_on_exit

DEMO = [sys.executable, "-m", "kvscope.cli", "demo", "--scale", "small"]


def test_ctrl_c_stops_broker_and_collector(tmp_path: Path) -> None:
    """Ctrl-C once the demo runs (it printed its dashboard: broker, tables, collector and
    serve are up and the simulation starts) ends it with 130 and leaves no child behind.
    The moment is observed, not slept for: the run that follows takes seconds of CPU, the
    test's read-then-signal microseconds, whatever the machine's load."""
    with killed_on_exit(
        subprocess.Popen(
            [*DEMO, "--out", str(tmp_path), "--serve-port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as demo:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        assert "live dashboard at" in line, f"no dashboard line, got {line!r}"
        children = child_pids(demo.pid)
        assert children, "the demo runs no broker process"
        assert demo.poll() is None, "the demo ended before the Ctrl-C"
        demo.send_signal(signal.SIGINT)
        _, stderr = demo.communicate(timeout=120)
    assert demo.returncode == 130, stderr
    assert "interrupted" in stderr
    assert not [pid for pid in children if is_running(pid)], "a child process outlived the demo"


@pytest.mark.parametrize(("flag", "code"), [("--port", 1), ("--serve-port", 2)])
def test_busy_port_says_what_to_do(tmp_path: Path, flag: str, code: int) -> None:
    """--serve-port taken printed a traceback, then blamed the collector and named --port."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*DEMO, "--out", str(tmp_path), flag, str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error) == 1, result.stderr
    assert f"{flag} {port} on 127.0.0.1 is in use" in error[0] or (
        f"port {port} on 127.0.0.1 is in use" in error[0] and f"{flag}" in error[0]
    )
    assert "✓ starting Kafka broker" not in result.stderr

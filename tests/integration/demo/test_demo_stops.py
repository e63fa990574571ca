"""`kvscope demo` stops everything it started on Ctrl-C, and explains a busy port."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from support.procfs import child_pids, is_running

DEMO = [sys.executable, "-m", "kvscope.collector.cli", "demo", "--scale", "small"]


def test_ctrl_c_stops_broker_and_collector(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [*DEMO, "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        children: list[int] = []
        while not children and time.monotonic() < deadline and demo.poll() is None:
            children = child_pids(demo.pid)  # the broker process
            time.sleep(0.05)
        assert children, "the demo never started its broker"
        time.sleep(1.0)  # into the simulation / collection
        demo.send_signal(signal.SIGINT)
        _, stderr = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 130, stderr
    assert "interrupted" in stderr
    assert not [pid for pid in children if is_running(pid)], "a child process outlived the demo"


def test_busy_port_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [*DEMO, "--out", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert "--port" in result.stderr

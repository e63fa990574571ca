"""`kvscope demo` stops everything it started on Ctrl-C, and explains a busy port."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> set[int]:
    """Direct child processes of `pid` (from /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = task / "children"
        if children.exists():
            found |= {int(c) for c in children.read_text().split()}
    return found


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_ctrl_c_stops_broker_and_collector(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope.collector.cli",
            "demo",
            "--scale",
            "small",
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        children: set[int] = set()
        while not children and time.monotonic() < deadline and demo.poll() is None:
            children = _children(demo.pid)  # the broker process
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
    assert not [pid for pid in children if _running(pid)], "a child process outlived the demo"


def test_busy_port_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvscope.collector.cli",
                "demo",
                "--scale",
                "small",
                "--out",
                str(tmp_path),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert "--port" in result.stderr

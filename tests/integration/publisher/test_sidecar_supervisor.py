"""`BridgeSupervisor` with the real `kvscope bridge` child and the real broker.

It restarts a child that was killed, stops it on request without leaving a process, the
child dies with its engine however the engine ends (PR_SET_PDEATHSIG), and a forked copy
of the engine never signals the parent's child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.vllm.sidecar import BridgeSupervisor, bridge_command
from kvscope.schemas import Source
from support.e2e_support import wait_for
from support.procfs import child_pids, is_running

ENGINE_SCRIPT = """
import sys, time
from kvscope.publisher.vllm.sidecar import BridgeSupervisor
supervisor = BridgeSupervisor(sys.argv[2:]).start()
while supervisor.pid is None:
    time.sleep(0.01)
print(supervisor.pid, flush=True)
if sys.argv[1] == "exit":
    time.sleep(0.5)
    sys.exit(0)  # no stop(): the supervisor thread ends with the process
time.sleep(600)
"""


def command(tmp_path: Path, bootstrap_servers: str, topic_prefix: str, state_dir: str) -> list[str]:
    """The bridge command the plugin would run for an engine publishing on an ipc socket."""
    config = PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    source = Source(instance="pod-s:8000", model="m", dp_rank=0, engine="vllm")
    return bridge_command(config, source, f"ipc://{tmp_path}/pub", None, state_dir)


def test_restarts_a_killed_child_and_stops_it(
    tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    supervisor = BridgeSupervisor(
        lambda state: command(tmp_path, bootstrap_servers, topic_prefix, state),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    try:
        supervisor.start()
        wait_for(lambda: supervisor.pid is not None, 30, "the first child")
        first = supervisor.pid
        assert first is not None and first in child_pids(os.getpid())
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: supervisor.pid not in (None, first), 30, "a restarted child")
        second = supervisor.pid
        assert second is not None and supervisor.restarts == 1
    finally:
        assert supervisor.stop(20), "the bridge ends on SIGTERM"
    assert not is_running(first) and not is_running(second)
    assert {first, second}.isdisjoint(child_pids(os.getpid()))
    assert not Path(supervisor.state_dir).exists()
    assert supervisor.stop(1), "stop() twice is harmless"


@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "exit"])
def test_child_dies_with_its_engine(
    tmp_path: Path, bootstrap_servers: str, topic_prefix: str, end: str
) -> None:
    bridge = command(tmp_path, bootstrap_servers, topic_prefix, str(tmp_path / "state"))
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE_SCRIPT, end, *bridge], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert engine.stdout is not None
        child = int(engine.stdout.readline())
        assert is_running(child)
        if end != "exit":
            engine.send_signal(getattr(signal, end))
        assert engine.wait(30) != 0 or end == "exit"
        wait_for(lambda: not is_running(child), 30, f"the bridge child after the engine's {end}")
    finally:
        engine.kill()
        engine.wait()
        if child and is_running(child):  # a failed run leaves no orphan behind
            os.kill(child, signal.SIGKILL)


def test_a_forked_copy_never_signals_the_child(
    tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    supervisor = BridgeSupervisor(
        lambda state: command(tmp_path, bootstrap_servers, topic_prefix, state)
    ).start()
    try:
        wait_for(lambda: supervisor.pid is not None, 30, "the child")
        child = supervisor.pid
        assert child is not None
        forked = os.fork()  # a bare fork, as an engine's multiprocessing might do
        if forked == 0:
            os._exit(0 if supervisor.stop(1, remove_state=False) else 1)
        assert os.waitpid(forked, 0)[1] == 0
        assert is_running(child) and supervisor.pid == child
        assert Path(supervisor.state_dir).exists()
    finally:
        supervisor.stop(20)
    assert not is_running(child)

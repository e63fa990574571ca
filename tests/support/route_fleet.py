"""Helpers of the `kvscope route` tests on real engines: vLLM API servers of the tiny model
(with a chat template), and `kvscope route` itself as a child process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kvscope.local.broker import free_port
from kvscope.local.demo_vllm import offline_vllm_env
from kvscope.local.processes import log_tail, stop_process, wait_healthy

from support.e2e_support import api_server_command

SERVED = "tiny"
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
"""A minimal chat template: the tiny tokenizer has none, and vLLM needs one for chat."""


def with_chat_template(model_dir: Path, dest: Path) -> Path:
    """A copy of the tiny model whose tokenizer carries `CHAT_TEMPLATE` (engines and a local
    tokenizer then apply the same template)."""
    shutil.copytree(model_dir, dest)
    config_file = dest / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config))
    return dest


@contextmanager
def engines(
    model_dir: Path,
    work: Path,
    count: int,
    env: Mapping[str, str] | None = None,
    *extra: str,
) -> Iterator[list[str]]:
    """`count` vLLM API servers of the model on free ports, started together; their URLs.

    `env` adds variables (e.g. KVSCOPE_* for the plugin; `{i}` in a value becomes the
    engine's number); KV events stay off unless `env` is given (then vLLM's ZMQ publisher,
    which kvscope's plugin tees into Kafka, is on). `extra`: more `vllm serve` flags."""
    servers: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for i in range(count):
            port = free_port()
            root = work / f"engine-{i}"
            root.mkdir(parents=True)
            events = {"enable_kv_cache_events": bool(env), "publisher": "zmq",
                      "endpoint": f"ipc://{root}/pub"}  # fmt: skip
            added = {k: v.replace("{i}", str(i)) for k, v in (env or {}).items()}
            child_env = {**os.environ, **offline_vllm_env(root),
                         "VLLM_ENABLE_V1_MULTIPROCESSING": "1", **added}  # fmt: skip
            log = root / "serve.log"
            args = api_server_command(model_dir, port, SERVED, events, "--seed", "1234", *extra)
            with log.open("wb") as out:
                process = subprocess.Popen(args, env=child_env, stdout=out, stderr=out)
            servers.append((process, f"http://127.0.0.1:{port}", log))
        for process, url, log in servers:
            wait_healthy(process, url, log, timeout_s=600)
        yield [url for _, url, _ in servers]
    finally:
        for process, _, _ in servers:
            stop_process(process, grace_s=30)


@contextmanager
def router(*args: str, work: Path) -> Iterator[str]:
    """`kvscope route ARGS --port P` as a child process; its URL once /healthz answers."""
    with kvscope_service("route", *args, work=work) as url:
        yield url


@contextmanager
def kvscope_service(command: str, *args: str, work: Path, ready_s: float = 60) -> Iterator[str]:
    """`kvscope COMMAND ARGS --port P` (route, index) as a child process; its URL once its
    /healthz answers. It must stop cleanly (exit 0) on SIGTERM."""
    port = free_port()
    log = work / f"{command}-{port}.log"
    argv = [sys.executable, "-m", "kvscope.cli", command, *args, "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            assert process.poll() is None, f"kvscope {command} exited:\n{log_tail(log)}"
            assert time.monotonic() < deadline, f"kvscope {command} not ready:\n{log_tail(log)}"
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=2).close()
                break
            except urllib.error.HTTPError:  # answering (the index: 503 until caught up)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        stop_process(process, grace_s=10)
        assert process.returncode == 0, log_tail(log)

"""Helpers of the `kvscope route` tests: vLLM API servers of the tiny model (with a chat
template; `shared_fleet`, the two engines every real-vLLM route test shares, also with a
LoRA adapter), `kvscope route` itself as a child process, and for the fault tests a fake engine
and a fake index served by uvicorn in a thread (`FakeEngine`, `FakeIndex`, `serving`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    events: Sequence[Mapping[str, Any]] | None = None,
) -> Iterator[list[str]]:
    """`count` vLLM API servers of the model on free ports, started together; their URLs.

    `env` adds variables (e.g. KVSCOPE_* for the plugin; `{i}` in a value becomes the
    engine's number); KV events stay off unless `env` is given (then vLLM's ZMQ publisher,
    which kvscope's plugin tees into Kafka, is on). `extra`: more `vllm serve` flags.
    `events`: each engine's `--kv-events-config` instead (e.g. kvscope's one switch)."""
    servers: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for i in range(count):
            port = free_port()
            root = work / f"engine-{i}"
            root.mkdir(parents=True)
            config = {"enable_kv_cache_events": bool(env), "publisher": "zmq",
                      "endpoint": f"ipc://{root}/pub"}  # fmt: skip
            added = {k: v.replace("{i}", str(i)) for k, v in (env or {}).items()}
            child_env = {**os.environ, **offline_vllm_env(root),
                         "VLLM_ENABLE_V1_MULTIPROCESSING": "1", **added}  # fmt: skip
            log = root / "serve.log"
            kv_events = events[i] if events else config
            args = api_server_command(model_dir, port, SERVED, kv_events, "--seed", "1234", *extra)
            with log.open("wb") as out:
                process = subprocess.Popen(args, env=child_env, stdout=out, stderr=out)
            servers.append((process, f"http://127.0.0.1:{port}", log))
        for process, url, log in servers:
            wait_healthy(process, url, log, timeout_s=600)
        yield [url for _, url, _ in servers]
    finally:
        for process, _, _ in servers:
            stop_process(process, grace_s=30)


SEED = "1234"
"""PYTHONHASHSEED of the shared fleet's engines and `--hash-seed` of the indexes reading them."""
LORA = "tiny-lora"
LORA_RANK = 8


def lora_adapter(directory: Path) -> Path:
    """A PEFT-format LoRA adapter of the tiny Llama (rank 8 on q_proj and v_proj of both
    layers, small random weights), written with torch and safetensors (no peft)."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    generator = torch.Generator().manual_seed(int(SEED))
    weights = {}
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            weights[f"{name}.lora_A.weight"] = torch.randn(LORA_RANK, 64, generator=generator)
            weights[f"{name}.lora_B.weight"] = torch.randn(64, LORA_RANK, generator=generator)
    save_file({k: v * 0.01 for k, v in weights.items()}, directory / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": 16,
              "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none",
              "fan_in_fan_out": False, "modules_to_save": None}  # fmt: skip
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


@dataclass(frozen=True)
class SharedFleet:
    """Two `vllm serve` engines of the tiny model with a chat template and the LoRA adapter
    `LORA`, publishing their KV events through kvscope's plugin as instances e0 and e1."""

    urls: list[str]
    model: Path
    adapter: Path
    bootstrap_servers: str
    topic_prefix: str


@contextmanager
def shared_fleet(model_dir: Path, work: Path, bootstrap_servers: str) -> Iterator[SharedFleet]:
    """Start the `SharedFleet` under `work` (its engines publish to `bootstrap_servers`)."""
    model = with_chat_template(model_dir, work / "model")
    adapter = lora_adapter(work / "adapter")
    prefix = f"t{uuid.uuid4().hex[:10]}."
    env = {
        "KVSCOPE_BOOTSTRAP_SERVERS": bootstrap_servers,
        "KVSCOPE_TOPIC_PREFIX": prefix,
        "KVSCOPE_INSTANCE": "e{i}",
        "PYTHONHASHSEED": SEED,
    }
    flags = ["--enable-prompt-tokens-details", "--enable-lora", "--max-lora-rank", str(LORA_RANK),
             "--lora-modules", f"{LORA}={adapter}"]  # fmt: skip
    with engines(model, work, 2, env, *flags) as urls:
        yield SharedFleet(urls, model, adapter, bootstrap_servers, prefix)


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


class Servers:
    """ASGI apps served by uvicorn on free loopback ports, each in a thread of its own;
    `close()` stops them all at once (a context manager: on exit)."""

    def __init__(self) -> None:
        self._running: list[tuple[Any, threading.Thread]] = []

    def start(self, app: Any, lifespan: str = "off") -> str:
        """Serve `app`; its URL once it listens."""
        import uvicorn

        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                lifespan=lifespan, access_log=False)  # fmt: skip
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        self._running.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    def stop(self, url: str) -> None:
        """Stop the server at `url` (its port then refuses connections)."""
        port = int(url.rsplit(":", 1)[1])
        for server, thread in self._running:
            if server.config.port == port:
                server.should_exit = True
                thread.join(10)

    def close(self) -> None:
        """Stop every server."""
        for server, _ in self._running:
            server.should_exit = True
        for _, thread in self._running:
            thread.join(10)

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _answer(send: Send, status: int, body: bytes, *, complete: bool = True,
                  length: int | None = None, kind: bytes = b"application/json",
                  extra: Sequence[tuple[bytes, bytes]] = ()) -> None:  # fmt: skip
    """Send an answer; `complete=False` returns after `body` without finishing it (uvicorn
    then drops the connection: a break-off)."""
    size = str(length if length is not None else len(body)).encode()
    headers = [(b"content-type", kind), (b"content-length", size), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": not complete})


async def _refused(send: Send, mode: str, who: str) -> bool:
    """Answer the error `mode` asks for (5xx: 500, 4xx: 400); whether it did."""
    if mode not in ("5xx", "4xx"):
        return False
    status = 500 if mode == "5xx" else 400
    error = {"error": {"message": f"{who} says {status}", "code": status}}
    await _answer(send, status, json.dumps(error).encode())
    return True


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class FakeEngine:
    """A stand-in for a vLLM OpenAI server, to inject faults a real engine cannot produce on
    demand: 5xx answers, stalls, answers broken off mid-body or mid-stream, a failing or
    slow `/tokenize`. It runs no model: completions answer fixed text, /tokenize one id per
    character (at most 4096). Everything else the router tests use real engines for.

    `mode` (completions): ok, 5xx, 4xx, stall (no answer until `release` is set), break_body,
    break_stream. `tokenize`: ok, 5xx, 4xx, slow (no answer until `release`). `seen`: the
    headers of every completion request, `tokenized`: the prompt length of every /tokenize.
    `adapters`: LoRA entries its /v1/models lists beside the base model (`id`, `root`,
    `parent`, as vLLM lists them). `calls`: how many requests each path got.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "ok"
        self.tokenize = "ok"
        self.release = threading.Event()
        self.seen: list[dict[str, str]] = []
        self.tokenized: list[int] = []
        self.adapters: list[dict[str, str]] = []
        self.calls: Counter[str] = Counter()

    async def _held(self) -> None:
        while not self.release.is_set():
            await asyncio.sleep(0.01)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app."""
        path = scope["path"]
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = await _read_body(receive)
        self.calls[path] += 1
        if path == "/health":
            await _answer(send, 200, b"")
        elif path == "/tokenize":
            await self._tokenize(send, json.loads(body))
        elif path == "/v1/models":
            models = [{"id": SERVED, "root": "/models/tiny"}, *self.adapters]
            await _answer(send, 200, json.dumps({"data": models}).encode())
        else:
            self.seen.append(headers)
            await self._complete(send, json.loads(body), headers)

    async def _tokenize(self, send: Send, request: dict[str, Any]) -> None:
        prompt = request.get("prompt") or json.dumps(request.get("messages"))
        self.tokenized.append(len(prompt))
        if self.tokenize == "slow":
            await self._held()
        if await _refused(send, self.tokenize, "tokenize"):
            return
        tokens = [ord(c) % 1000 for c in prompt[:4096]]
        await _answer(send, 200, json.dumps({"tokens": tokens, "count": len(tokens)}).encode())

    async def _complete(self, send: Send, request: dict[str, Any], headers: dict[str, str]) -> None:
        if self.mode == "stall":
            await self._held()
        if await _refused(send, self.mode, "engine"):
            return
        answer = json.dumps({"engine": self.name, "choices": [{"text": "x" * 64}]}).encode()
        if self.mode == "break_body":
            await _answer(send, 200, answer[:20], complete=False, length=len(answer))
            return
        if request.get("stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
            for i in range(3):
                event = json.dumps({"engine": self.name, "i": i}).encode()
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n",
                            "more_body": True})  # fmt: skip
                if self.mode == "break_stream" and i == 1:
                    return
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        if "gzip" in headers.get("accept-encoding", ""):
            await _answer(send, 200, gzip.compress(answer), extra=[(b"content-encoding", b"gzip")])
            return
        await _answer(send, 200, answer)


class FakeIndex:
    """A stand-in for `kvscope index`, to make it slow, refuse the token, or say it is not
    ready on demand (a real index cannot be made slow). It says `holder` caches every
    prompt whole.

    `mode` (/score): ok, slow (no answer until `release`), refuse (401), not_ready (answers
    with `ready: false`), 5xx. `healthy` (/healthz): 200 or 503. /routed answers 404 (the
    source has not published yet) while `known` is False. `scored`: every /score body.
    """

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.mode = "ok"
        self.healthy = True
        self.known = False
        self.release = threading.Event()
        self.scored: list[dict[str, Any]] = []
        self.routed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app."""
        path = scope["path"]
        body = await _read_body(receive)
        if path == "/healthz":
            ok = self.healthy
            await _answer(send, 200 if ok else 503, json.dumps({"ok": ok}).encode())
        elif path == "/routed":
            self.routed += 1
            await _answer(send, 200 if self.known else 404, b'{"error": "no source"}')
        else:
            request = json.loads(body)
            self.scored.append(request)
            if self.mode == "slow":
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            if self.mode in ("refuse", "5xx"):
                status = 401 if self.mode == "refuse" else 500
                await _answer(send, status, b'{"error": "no"}')
                return
            tokens = len(request["token_ids"])
            source = {"instance": self.holder, "matched_tokens": tokens, "matched_blocks": 1}
            result = {"lag_s": 0.0, "sources": [source], "ready": self.mode != "not_ready"}
            await _answer(send, 200, json.dumps(result).encode())

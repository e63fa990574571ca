"""A real vLLM engine with kvscope's plugin -> Kafka -> `kvscope index`: scoring a prompt
by its token ids reports the blocks the engine holds for it, and 0 once it evicted them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from support.index_kit import IndexProcess
from support.vllm_e2e import plugin_env, read_until, start_engine_proc

pytestmark = pytest.mark.vllm

BLOCK = 32


def _until(index: IndexProcess, tokens: list[int], model: str, blocks: int) -> dict[str, Any]:
    """The engine's score once it reports `blocks` matched blocks (404 until the index has
    seen the engine's first blocks)."""
    deadline = time.monotonic() + 60
    answer: Any = None
    while time.monotonic() < deadline:
        status, answer = index.request("/score", {"token_ids": tokens, "model": model})
        assert status in (200, 404), answer
        if status == 200:
            (source,) = answer["sources"]
            if source["matched_blocks"] == blocks:
                return dict(source)
        time.sleep(0.2)
    raise AssertionError(f"never {blocks} blocks: {answer}\n{index.output()[-2000:]}")


def test_score_by_token_ids_follows_what_the_engine_holds(
    tiny_llama: Path, tmp_path: Path, bootstrap_servers: str, topic_prefix: str
) -> None:
    prompt = list(range(5, 5 + 4 * BLOCK + 7))  # 4 full blocks and a partial one
    others = [[(150 + 7 * p + 3 * i) % 250 for i in range(5 * BLOCK)] for p in range(3)]  # evict it
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"phases": [[prompt], others, [prompt]]}))
    env = plugin_env(bootstrap_servers, topic_prefix, "pod-a:8000")
    go = tmp_path / "go"
    args = [str(tiny_llama), f"ipc://{tmp_path}/pub", str(go), str(prompts)]
    engine = start_engine_proc(args, env, "index_engine_proc.py")
    index = IndexProcess(bootstrap_servers, topic_prefix, tmp_path / "index.log")
    model = str(tiny_llama)
    try:
        read_until(engine, "ready")
        index.start()
        Path(f"{go}.0").touch()
        read_until(engine, "phase 0")
        held = _until(index, prompt, model, 4)
        assert held["instance"] == "pod-a:8000"
        assert (held["matched_tokens"], held["stale"]) == (4 * BLOCK, False)

        Path(f"{go}.1").touch()
        read_until(engine, "phase 1")
        gone = _until(index, prompt, model, 0)
        assert gone["matched_tokens"] == 0

        Path(f"{go}.2").touch()
        again = json.loads(read_until(engine, "phase 2").split(" ", 2)[2])
        assert again["cached"] == [0], "vLLM itself found none of the evicted blocks"
        assert _until(index, prompt, model, 4)["matched_blocks"] == 4
    finally:
        index.stop()
        engine.kill()
        engine.wait()

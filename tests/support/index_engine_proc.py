"""A real in-process vLLM `LLMEngine` with kvscope's plugin, driven step by step for the
index's end-to-end test.

`python index_engine_proc.py MODEL_DIR PUB_URL GO_FILE PROMPTS_JSON`: PROMPTS_JSON holds
`{"phases": [[tokens, ...], ...]}`. The engine (prefix caching, KV events on vLLM's ZMQ
publisher, which the plugin tees into Kafka from the KVSCOPE_* variables; a 12-block cache
of 32-token blocks) prints "ready", then for each phase k waits for GO_FILE.k, runs that
phase's prompts one after the other (one output token each) and prints
`phase k {"cached": [...]}` with vLLM's own num_cached_tokens per prompt. Exits after the
last phase (kvscope flushes at exit).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tinyllama import apply_env, tiny_engine_kwargs


def main() -> None:
    model_dir, pub_url, go_file, prompts_file = sys.argv[1:5]
    apply_env(Path(go_file).parent)
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=pub_url
        ),
        num_gpu_blocks_override=12,
        max_model_len=256,
        max_num_batched_tokens=256,
    )
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    phases = json.loads(Path(prompts_file).read_text())["phases"]
    print("ready", flush=True)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for k, prompts in enumerate(phases):
        while not Path(f"{go_file}.{k}").exists():
            time.sleep(0.02)
        cached = []
        for n, tokens in enumerate(prompts):
            engine.add_request(f"p{k}-{n}", {"prompt_token_ids": tokens}, params)
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        cached.append(output.num_cached_tokens or 0)
        print(f"phase {k} " + json.dumps({"cached": cached}), flush=True)


if __name__ == "__main__":
    main()

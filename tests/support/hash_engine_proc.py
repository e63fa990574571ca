"""A real in-process vLLM `LLMEngine` that runs given prompts, for the block-hash test.

Run as a subprocess (vLLM derives its NONE_HASH seed from the process's PYTHONHASHSEED
once per engine): `python hash_engine_proc.py MODEL_DIR PUB_URL GO_FILE ALGO BLOCK_SIZE
PROMPTS_JSON`. PROMPTS_JSON is a file holding a list of `{"tokens": [...], "cache_salt":
str | null}`. The engine has prefix caching and KV events on (vLLM's own ZMQ publisher at
PUB_URL) with `--prefix-caching-hash-algo ALGO` and BLOCK_SIZE-token blocks. Prints
"ready", waits for GO_FILE, runs the prompts one after the other (one output token each),
then prints `truth {"cached": [num_cached_tokens per prompt]}` and exits.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tinyllama import apply_env, tiny_engine_kwargs


def main() -> None:
    model_dir, pub_url, go_file, algo, block_size, prompts_file = sys.argv[1:7]
    apply_env(Path(go_file).parent)
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=pub_url
        ),
        prefix_caching_hash_algo=algo,
        block_size=int(block_size),
    )
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    prompts = json.loads(Path(prompts_file).read_text())
    print("ready", flush=True)
    while not Path(go_file).exists():
        time.sleep(0.02)

    params = SamplingParams(max_tokens=1, temperature=0.0)
    cached = []
    for index, prompt in enumerate(prompts):
        request: dict[str, object] = {"prompt_token_ids": prompt["tokens"]}
        if prompt["cache_salt"] is not None:
            request["cache_salt"] = prompt["cache_salt"]
        engine.add_request(f"p{index}", request, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    cached.append(output.num_cached_tokens or 0)
    time.sleep(0.3)  # let vLLM's ZMQ thread send its last batches
    print("truth " + json.dumps({"cached": cached}), flush=True)


if __name__ == "__main__":
    main()

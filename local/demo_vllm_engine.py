"""One real vLLM engine for `kvscope demo --engine vllm`, run as its own process.

`python -m kvscope.local.demo_vllm_engine MODEL_PATH ENDPOINT REQUESTS SEED` starts an
in-process `LLMEngine` with prefix caching, KV-cache events (vLLM's ZMQ publisher, which
kvscope's plugin tees into Kafka) and kvscope's stat logger, then serves a shared-prefix
workload of token-id prompts through a cache small enough to evict. The `KVSCOPE_*`
variables (brokers, topic prefix, instance) and vLLM's offline settings come from the
environment (`demo_vllm.engine_env`). Prints `ready`, then `done N` after each finished
request; kvscope's publisher flushes at exit.
"""

from __future__ import annotations

import random
import sys

BLOCK_SIZE = 32
CACHE_BLOCKS = 20
"""KV blocks of the engine: more than one longest prompt (8 blocks), far fewer than the
workload's distinct prefixes, so blocks get evicted and refault."""
GROUPS = 4
SYSTEM_PROMPT_TOKENS = 128
QUESTION_TOKENS = (24, 72)
TOKEN_IDS = (10, 500)
"""Token ids drawn from this range: inside any model's vocabulary."""


def prompts(requests: int, seed: int) -> list[list[int]]:
    """Shared system prompts (the same on every engine) + questions distinct per `seed`."""
    shared = random.Random(0)
    systems = [
        [shared.randrange(*TOKEN_IDS) for _ in range(SYSTEM_PROMPT_TOKENS)] for _ in range(GROUPS)
    ]
    rng = random.Random(seed + 1)
    return [
        rng.choice(systems)
        + [rng.randrange(*TOKEN_IDS) for _ in range(rng.randint(*QUESTION_TOKENS))]
        for _ in range(requests)
    ]


def main(argv: list[str]) -> None:
    """Serve the workload on one engine; see the module docstring."""
    model_path, endpoint, requests, seed = argv[0], argv[1], int(argv[2]), int(argv[3])
    from kvscope.publisher.vllm.stats import KvscopeStatLogger
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=model_path,
            tokenizer=model_path,
            dtype="float32",
            block_size=BLOCK_SIZE,
            enable_prefix_caching=True,
            enforce_eager=True,
            max_model_len=512,
            max_num_seqs=4,
            max_num_batched_tokens=512,
            num_gpu_blocks_override=CACHE_BLOCKS,
            seed=seed,
            disable_log_stats=False,
            kv_events_config=KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint
            ),
        ),
        stat_loggers=[KvscopeStatLogger],
    )
    print("ready", flush=True)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    done = 0
    for number, tokens in enumerate(prompts(requests, seed)):
        engine.add_request(f"demo-{seed}-{number}", {"prompt_token_ids": tokens}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    done += 1
                    print(f"done {done}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""A real in-process vLLM `LLMEngine` replaying a Mooncake-format trace, kvscope on.

Run as a subprocess (vLLM reads its environment at import, and plugins load once per
process): `python trace_engine_proc.py MODEL_DIR TRACE WORKDIR BLOCKS [PART/PARTS]
[TIME_SCALE]`. The engine has BLOCKS KV blocks of 32 tokens (`num_gpu_blocks_override`),
prefix caching, KV events on vLLM's ZMQ publisher (teed into Kafka by kvscope's plugin,
which also publishes the access stream) and `KvscopeStatLogger`; the KVSCOPE_* variables
come from the environment. With PART/PARTS it serves the trace lines whose index is PART
modulo PARTS (a static split over PARTS engines).

One trace id is one 32-token block: its tokens are drawn from a generator seeded by the
id, so equal ids give equal blocks; a prompt longer than its ids cover is padded with
tokens of its own. Requests are added at their trace timestamps (ms, times TIME_SCALE)
in wall time while the engine steps; each generates exactly `output_length` tokens.
Prints one line `truth {json}`: per request [prompt tokens, vLLM's num_cached_tokens,
output tokens], and vLLM's hit rate (cached / prompt tokens).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.tinyllama import BLOCK_SIZE, VOCAB_SIZE, apply_env, tiny_engine_kwargs

FIRST_TOKEN = 3
"""Token ids below this are the tokenizer's special tokens."""


def id_tokens(cache: dict[int, list[int]], block_id: int) -> list[int]:
    """The 32 tokens trace id `block_id` stands for (the same in every process)."""
    tokens = cache.get(block_id)
    if tokens is None:
        rng = random.Random(f"trace-id/{block_id}")
        tokens = [rng.randrange(FIRST_TOKEN, VOCAB_SIZE) for _ in range(BLOCK_SIZE)]
        cache[block_id] = tokens
    return tokens


def prompt_of(cache: dict[int, list[int]], index: int, line: dict) -> list[int]:
    """Line `index`'s prompt: its ids' tokens, cut or padded to `input_length`."""
    prompt: list[int] = []
    for block_id in line["hash_ids"][: math.ceil(line["input_length"] / BLOCK_SIZE)]:
        prompt.extend(id_tokens(cache, block_id))
    del prompt[line["input_length"] :]
    rng = random.Random(f"trace-request/{index}")
    pad = line["input_length"] - len(prompt)
    return prompt + [rng.randrange(FIRST_TOKEN, VOCAB_SIZE) for _ in range(pad)]


def main() -> None:
    model_dir, trace, workdir, blocks = sys.argv[1:5]
    part, parts = (int(x) for x in (sys.argv[5] if len(sys.argv) > 5 else "0/1").split("/"))
    time_scale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
    apply_env(Path(workdir))
    from kvscope.publisher.vllm.stats import KvscopeStatLogger
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    kwargs = tiny_engine_kwargs(
        Path(model_dir),
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=f"ipc://{workdir}/kv-events-{part}",
        ),
        num_gpu_blocks_override=int(blocks),
        disable_log_stats=False,
    )
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs), stat_loggers=[KvscopeStatLogger])
    lines = [json.loads(x) for x in Path(trace).read_text().splitlines() if x.strip()]
    cache: dict[int, list[int]] = {}
    todo = [
        (line["timestamp"] / 1000 * time_scale, f"t{i}", prompt_of(cache, i, line), line)
        for i, line in enumerate(lines)
        if i % parts == part
    ]
    finished: dict[str, list[int]] = {}
    start = time.monotonic()
    while todo or engine.has_unfinished_requests():
        now = time.monotonic() - start
        while todo and todo[0][0] <= now:
            _, request_id, prompt, line = todo.pop(0)
            n = line["output_length"]
            params = SamplingParams(max_tokens=max(n, 1), min_tokens=max(n, 1), ignore_eos=True)
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        if not engine.has_unfinished_requests():
            time.sleep(min(0.005, max(0.0, todo[0][0] - now)) if todo else 0)
            continue
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = [
                    len(output.prompt_token_ids),
                    output.num_cached_tokens or 0,
                    len(output.outputs[0].token_ids),
                ]
    prompt_tokens = sum(r[0] for r in finished.values())
    cached = sum(r[1] for r in finished.values())
    truth = {"requests": finished, "hit_rate": cached / prompt_tokens, "blocks": int(blocks)}
    time.sleep(0.3)  # let vLLM's ZMQ thread send its last batches
    print("truth " + json.dumps(truth), flush=True)


if __name__ == "__main__":
    main()

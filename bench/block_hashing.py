"""Block hashes from token ids: kvscope's BlockHasher vs vLLM's own request block hasher.

A router that scores by token ids pays this for every request, so it is on the hot path.
For each `--prefix-caching-hash-algo`, one run times both on the same prompts of
`--blocks` full blocks of `--block-size` tokens (a partial block after them):

- kvscope: `BlockHasher(algo, seed).block_hashes(tokens, block_size)`, UInt64 hashes;
- baseline: vLLM's `get_request_block_hasher` run on the same prompt (vLLM's own code path,
  extra keys included) plus `maybe_convert_block_hash` on each hash, as vLLM publishes them.

Both must give the same hashes (checked first). Reported: CPU microseconds per prompt (median
of `--rounds` rounds of `--prompts` prompts each) and kvscope / baseline.
Usage: python bench/block_hashing.py [--blocks 100] [--block-size 16] [--prompts 500]
[--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from kvscope.index.hashing import ALGOS, BlockHasher

SEED = "20261127"


def vllm_hasher(algo: str, block_size: int) -> Callable[[list[int]], list[int]]:
    """vLLM's own hashing of a prompt's full blocks, converted as vLLM publishes them."""
    os.environ["PYTHONHASHSEED"] = SEED
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "1"
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name(algo)
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
    convert = kv_cache_utils.maybe_convert_block_hash

    def run(tokens: list[int]) -> list[int]:
        request: Any = SimpleNamespace(
            block_hashes=[],
            num_tokens=len(tokens),
            all_token_ids=tokens,
            mm_features=[],
            lora_request=None,
            cache_salt=None,
            prompt_embeds=None,
        )
        return [convert(h) for h in hasher(request)]

    return run


def per_prompt_us(run: Callable[[list[int]], list[int]], prompts: list[list[int]]) -> float:
    """CPU time per prompt, microseconds (CPU, not wall: the machine is shared)."""
    start = time.process_time()
    for tokens in prompts:
        run(tokens)
    return (time.process_time() - start) / len(prompts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(0)
    length = args.blocks * args.block_size + args.block_size // 2
    prompts = [[rng.randrange(150_000) for _ in range(length)] for _ in range(args.prompts)]
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}; "
        f"{args.blocks} blocks of {args.block_size} tokens per prompt"
    )
    for algo in ALGOS:
        ours = BlockHasher(algo, SEED)

        def kvscope(tokens: list[int], hasher: BlockHasher = ours) -> list[int]:
            return hasher.block_hashes(tokens, args.block_size)

        baseline = vllm_hasher(algo, args.block_size)
        assert kvscope(prompts[0]) == baseline(prompts[0]), f"{algo}: hashes differ"
        times: dict[str, list[float]] = {"kvscope": [], "baseline": []}
        for _ in range(args.rounds):  # alternate, so load changes hit both alike
            times["kvscope"].append(per_prompt_us(kvscope, prompts))
            times["baseline"].append(per_prompt_us(baseline, prompts))
        ours_us, base_us = (statistics.median(times[k]) for k in ("kvscope", "baseline"))
        print(
            f"{algo:12} kvscope {ours_us:7.1f} µs/prompt  vLLM {base_us:7.1f} µs/prompt  "
            f"ratio {ours_us / base_us:.2f}"
        )


if __name__ == "__main__":
    main()

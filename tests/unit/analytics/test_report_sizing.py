"""KV bytes per token from a Hugging Face config.json (`kvscope report --model-config`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvscope.analytics.report.sizing import from_model_config
from kvscope.schemas import ConfigError

LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def _write(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "config",
    [
        LLAMA_8B,
        {**LLAMA_8B, "head_dim": 128},
        {"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128},  # no heads count
    ],
)
def test_kv_bytes_per_token_from_any_sufficient_fields(tmp_path: Path, config: dict) -> None:
    assert from_model_config(_write(tmp_path, config)) == 32 * 8 * 128 * 2 * 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**LLAMA_8B, "num_attention_heads": 0, "num_key_value_heads": None}, "is 0, not a whole"),
        ({**LLAMA_8B, "num_attention_heads": 0}, "num_attention_heads is 0, not a whole"),
        ({**LLAMA_8B, "num_hidden_layers": "32"}, "num_hidden_layers is '32', not a whole"),
        ({**LLAMA_8B, "num_hidden_layers": 32.5}, "num_hidden_layers is 32.5"),
        ({"num_hidden_layers": 32}, "lacks 'num_attention_heads'"),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_unusable_model_config_says_which_field(
    tmp_path: Path, config: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        from_model_config(_write(tmp_path, config))

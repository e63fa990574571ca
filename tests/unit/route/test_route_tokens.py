"""`--tokenizer`: the router's local tokenizer gives the ids `transformers`' own `encode`
gives (the real-vLLM test compares them with an engine's `/tokenize`), though it calls the
`tokenizers` encoder directly. On the tests' locally trained tokenizer (the session's tiny
Llama's, which the real-vLLM tests use too), saved as is and with truncation and padding
set in its tokenizer.json (which `encode` ignores unless asked), over prompts of many
shapes."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import pytest
from kvscope.route.tokens import LocalTokenizer

WORDS = ["the", "cache", "block", "prefix", "Zürich", "東京", "<s>", "</s>", "<unk>", "\t", "\n",
         "", "  ", "kafka-7", "émigré"]  # fmt: skip


def prompts() -> list[str]:
    rng = random.Random(7)
    mixed = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, n)))
             for n in (2, 20, 200) for _ in range(12)]  # fmt: skip
    return ["", " ", "<s>", "a</s>b", "  lead and trail  ", *mixed]


@pytest.mark.parametrize("configured", ["as_saved", "truncation_and_padding"])
def test_the_local_tokenizer_gives_transformers_ids(
    tiny_llama: Path, configured: str, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    saved = Path(shutil.copytree(tiny_llama, tmp_path / "model"))
    if configured == "truncation_and_padding":
        spec_file = saved / "tokenizer.json"
        spec = json.loads(spec_file.read_text())
        spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                              "stride": 0}  # fmt: skip
        spec["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_id": 0,
                           "pad_type_id": 0, "pad_token": "<unk>",
                           "pad_to_multiple_of": None}  # fmt: skip
        spec_file.write_text(json.dumps(spec))
    local = LocalTokenizer(str(saved))
    reference = AutoTokenizer.from_pretrained(str(saved))
    texts = prompts()
    for special in (True, False):
        ours = [asyncio.run(local.completion(text, "m", special)) for text in texts]
        theirs = [reference.encode(text, add_special_tokens=special) for text in texts]
        assert ours == theirs
    assert any(len(ids) > 64 for ids in ours)  # neither truncated nor padded

"""BlockHasher without vLLM: real captured vLLM events recomputed, configuration errors,
and the properties any prefix-cache hash has (full blocks only, chained, keyed apart).

The exact values are checked against vLLM's own functions and a real engine in
tests/vllm/test_index_hashing_vllm.py.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from kvscope.index.errors import IndexConfigError, IndexServiceError
from kvscope.index.hashing import ALGOS, BlockHasher
from kvscope.schemas import BlockStored, decode_engine_payload
from kvscope.schemas.errors import ConfigError, KvscopeError

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
SEEDED = [(algo, "0") for algo in ALGOS]
"""One working configuration per algorithm (the xxhash ones need a seed)."""


def _tokens(count: int, seed: int = 0) -> list[int]:
    """`count` token ids, some past the one-, two- and four-byte integer encodings."""
    rng = random.Random(seed)
    wide = (0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 + 5)
    return [
        rng.choice(wide) if rng.random() < 0.1 else rng.randrange(200_000) for _ in range(count)
    ]


@pytest.mark.parametrize("capture", sorted(p.stem for p in DATA.glob("*.msgpack")))
def test_recomputes_every_hash_of_the_captured_vllm_events(capture: str) -> None:
    """Real vLLM 0.32 events (sha256, PYTHONHASHSEED unset): each BlockStored's hashes follow
    from the token ids of its chain (the parent's prefix plus its own tokens)."""
    meta = json.loads((DATA / f"{capture}.json").read_text())
    hasher = BlockHasher()
    prefix_of: dict[int, list[int]] = {}  # block hash -> the tokens up to its end
    checked = 0
    for _topic, _seq, payload in msgspec.msgpack.decode((DATA / f"{capture}.msgpack").read_bytes()):
        for event in decode_engine_payload(payload, keep_token_ids=True).events:
            if not isinstance(event, BlockStored):
                continue
            assert event.token_ids is not None
            parent = event.parent_block_hash
            tokens = (prefix_of[parent] if parent is not None else []) + event.token_ids
            hashes = hasher.block_hashes(tokens, event.block_size)
            assert hashes[-len(event.block_hashes) :] == list(event.block_hashes)
            assert len(hashes) * event.block_size == len(tokens)
            for count, block_hash in enumerate(hashes, 1):
                prefix_of[block_hash] = tokens[: count * event.block_size]
            checked += 1
    assert checked == meta["counts"]["stored_events"] > 0


@pytest.mark.parametrize("algo", ["sha1", "SHA256", "", "xxh3", "sha256 "])
def test_unknown_algorithm_is_a_config_error(algo: str) -> None:
    with pytest.raises(IndexConfigError, match="--prefix-caching-hash-algo") as caught:
        BlockHasher(algo)
    for root in (ValueError, ConfigError, IndexServiceError, KvscopeError):
        assert isinstance(caught.value, root)
    assert all(name in str(caught.value) for name in ALGOS)


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_xxhash_needs_the_fleets_seed(algo: str) -> None:
    with pytest.raises(IndexConfigError, match="PYTHONHASHSEED"):
        BlockHasher(algo)
    assert len(BlockHasher(algo, "7").block_hashes(_tokens(32), 16)) == 2


SEED_CANDIDATES = [
    "0", "7", "042", "4294967295", "4294967296", "99999999999999999999", "-1", "-0",
    "+7", " 9", "\t9", "9 ", "abc", "random", "RANDOM", " random", "1_000", "0x10", "1e3",
    "\u0663", "-", " ", "",
]  # fmt: skip


@pytest.mark.parametrize("seed", SEED_CANDIDATES)
def test_a_seed_is_accepted_exactly_when_python_accepts_it_as_pythonhashseed(seed: str) -> None:
    """No engine can run with a PYTHONHASHSEED Python refuses; every one it accepts works."""
    python = subprocess.run(
        [sys.executable, "-S", "-c", "pass"],
        env={"PYTHONHASHSEED": seed},
        capture_output=True,
        timeout=30,
    )
    try:
        BlockHasher("sha256", seed)
    except IndexConfigError as exc:
        assert "PYTHONHASHSEED" in str(exc)
        assert python.returncode != 0, f"Python starts with PYTHONHASHSEED={seed!r}"
    else:
        assert python.returncode == 0, python.stderr


@pytest.mark.parametrize(("module", "algo"), [("cbor2", "sha256_cbor"), ("xxhash", "xxhash")])
def test_a_missing_optional_module_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, module: str, algo: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(IndexConfigError, match=f"pip install {module}"):
        BlockHasher(algo, "1")
    assert len(BlockHasher("sha256").block_hashes(_tokens(16), 16)) == 1


@pytest.mark.parametrize(("algo", "seed"), SEEDED)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_only_full_blocks_are_hashed_and_a_prefix_keeps_its_hashes(
    algo: str, seed: str, block_size: int
) -> None:
    hasher = BlockHasher(algo, seed)
    tokens = _tokens(7 * block_size + block_size // 2)
    full = hasher.block_hashes(tokens, block_size)
    assert len(full) == len(tokens) // block_size == len(set(full))
    assert all(0 <= h < 2**64 for h in full)
    for length in sorted({0, 1, block_size - 1, block_size, block_size + 1, len(tokens) - 1}):
        assert hasher.block_hashes(tokens[:length], block_size) == full[: length // block_size]


@pytest.mark.parametrize(("algo", "seed"), SEEDED)
def test_a_changed_token_changes_its_block_and_every_later_one(algo: str, seed: str) -> None:
    hasher = BlockHasher(algo, seed)
    tokens = _tokens(6 * 16)
    before = hasher.block_hashes(tokens, 16)
    for position in (0, 15, 16, 40, len(tokens) - 1):
        changed = [*tokens]
        changed[position] += 1
        after = hasher.block_hashes(changed, 16)
        block = position // 16
        assert after[:block] == before[:block]
        assert all(a != b for a, b in zip(after[block:], before[block:], strict=True))


@pytest.mark.parametrize(("algo", "seed"), SEEDED)
def test_salt_and_lora_keep_requests_apart(algo: str, seed: str) -> None:
    hasher = BlockHasher(algo, seed)
    tokens = _tokens(4 * 16)
    plain = hasher.block_hashes(tokens, 16)
    assert hasher.block_hashes(tokens, 16, cache_salt="") == plain  # vLLM ignores an empty salt
    keyed = [
        hasher.block_hashes(tokens, 16, cache_salt="tenant-a"),
        hasher.block_hashes(tokens, 16, cache_salt="tenant-b"),
        hasher.block_hashes(tokens, 16, lora_name="sql", lora_path="/adapters/sql"),
        hasher.block_hashes(tokens, 16, lora_name="sql", lora_path="/adapters/sql-v2"),
        hasher.block_hashes(tokens, 16, lora_name="chat", lora_path="/adapters/sql"),
        hasher.block_hashes(
            tokens, 16, lora_name="sql", lora_path="/adapters/sql", cache_salt="tenant-a"
        ),
    ]
    every = [plain, *keyed]
    for block in range(len(plain)):  # the chain carries the first block's salt onwards
        assert len({hashes[block] for hashes in every}) == len(every)


def test_configurations_disagree() -> None:
    """A router configured unlike its fleet gets other hashes (it matches nothing)."""
    configs = [("sha256", None), ("sha256", "0"), ("sha256", "1"), ("sha256", "random")]
    configs += [("sha256_cbor", None), ("sha256_cbor", "0"), *SEEDED[2:], ("xxhash", "1")]
    tokens = _tokens(16)
    firsts = {BlockHasher(algo, seed).block_hashes(tokens, 16)[0] for algo, seed in configs}
    assert len(firsts) == len(configs)


def test_numpy_token_ids_hash_like_python_ints() -> None:
    import numpy as np

    tokens = [t for t in _tokens(5 * 16) if t < 2**31]
    hasher = BlockHasher()
    expected = hasher.block_hashes(tokens, 16)
    for dtype in (np.int32, np.int64, np.uint32):
        assert hasher.block_hashes(np.array(tokens, dtype=dtype), 16) == expected
    with pytest.raises(TypeError):
        hasher.block_hashes([float(t) for t in tokens], 16)


@pytest.mark.parametrize("block_size", [0, -1, -16])
def test_bad_block_size_is_a_config_error(block_size: int) -> None:
    with pytest.raises(IndexConfigError, match="block size"):
        BlockHasher().block_hashes(_tokens(32), block_size)


@pytest.mark.parametrize(("name", "path"), [("sql", None), (None, "/a"), ("", "/a"), ("sql", "")])
def test_a_lora_needs_its_name_and_path(name: str | None, path: str | None) -> None:
    with pytest.raises(IndexConfigError, match="--lora-modules"):
        BlockHasher().block_hashes(_tokens(32), 16, lora_name=name, lora_path=path)


def test_the_hasher_is_a_frozen_value() -> None:
    hasher = BlockHasher()
    assert hasher == BlockHasher("sha256", None) != BlockHasher("sha256", "0")
    assert hash(hasher) == hash(BlockHasher())
    with pytest.raises(dataclasses.FrozenInstanceError):
        hasher.algo = "xxhash"  # type: ignore[misc]


def test_hashing_runs_without_vllm() -> None:
    """The index runs where vLLM is not installed: hashing never imports it (or torch)."""
    script = (
        "import sys\nfrom kvscope.index.hashing import ALGOS, BlockHasher\n"
        "for algo in ALGOS:\n    BlockHasher(algo, '1').block_hashes(range(64), 16)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'torch', 'numpy'}))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

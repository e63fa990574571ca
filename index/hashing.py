"""vLLM's prefix-cache block hashes computed from token ids, without vLLM.

A router that holds a request's token ids asks the index which source holds its leading
blocks; the index knows blocks by the hashes the engines published. `BlockHasher`
computes those hashes the way vLLM 0.32 does (`vllm.v1.core.kv_cache_utils`):

- only full blocks are hashed; block i's hash is `H((parent, tokens_i, extra_keys_i))`,
  chained from `parent = NONE_HASH` for the first block;
- `H` is the engine's `--prefix-caching-hash-algo`: `sha256` (pickle, the default),
  `sha256_cbor` (canonical CBOR), `xxhash` and `xxhash_cbor` (the 128-bit XXH3 digest of
  the pickle / CBOR bytes);
- `NONE_HASH = H(seed)`, the seed being the engine's `PYTHONHASHSEED` when it is set, and
  otherwise `"vllm-none-hash"` for the SHA-256 algorithms; the xxhash algorithms then
  draw a random seed in every engine process, whose hashes nobody can reproduce;
- `extra_keys` is `None`, or a tuple of `("lora", name, path)` on every block of a LoRA
  request and `("cache_salt", salt)` on the first block of a salted one (in that order);
- the published hash is the digest's last 8 bytes as an unsigned big-endian int
  (`kvscope.schemas.engines.normalize_hash`, what kvscope stores for every event).

Not covered: multimodal inputs and prompt embeddings (their extra keys need the media
and the embeddings) and hybrid models that hash at a block size other than the cache's.
"""

from __future__ import annotations

import hashlib
import operator
import pickle
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from kvscope.index.errors import IndexConfigError
from kvscope.schemas.engines import normalize_hash

ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
"""The values of vLLM's `--prefix-caching-hash-algo`."""
DEFAULT_SEED = "vllm-none-hash"
"""vLLM's NONE_HASH seed for the SHA-256 algorithms when PYTHONHASHSEED is unset."""
_RANDOM_SEEDED = frozenset({"xxhash", "xxhash_cbor"})
_HASH_SEED = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
"""What Python's start-up parses as an integer PYTHONHASHSEED (C `strtoul`)."""
_MAX_HASH_SEED = 4294967295

Serializer = Callable[[Any], bytes]


class _Hash(Protocol):
    """A hashlib-style hash object (hashlib's sha256, xxhash's xxh3_128)."""

    def digest(self) -> bytes:
        """The hash of the bytes it was made from."""
        ...


def _serializer(algo: str) -> Serializer:
    """How vLLM turns a block's key into bytes: pickle, or canonical CBOR for `*_cbor`."""
    if not algo.endswith("_cbor"):
        return partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        import cbor2
    except ImportError:
        raise IndexConfigError(f"{algo} needs cbor2: pip install cbor2") from None
    return partial(cbor2.dumps, canonical=True)


def _hash_constructor(algo: str) -> Callable[[bytes], _Hash]:
    """The hash of vLLM's `algo` (`vllm.utils.hashing`): SHA-256, or the 128-bit XXH3."""
    if algo.startswith("sha256"):
        return hashlib.sha256
    try:
        import xxhash
    except ImportError:
        raise IndexConfigError(f"{algo} needs xxhash: pip install xxhash") from None
    return xxhash.xxh3_128


def _none_hash_seed(algo: str, seed: str | None) -> str:
    """The string NONE_HASH is derived from, as vLLM's `resolve_none_hash_seed` picks it for
    an engine whose PYTHONHASHSEED is `seed` (None: unset)."""
    if seed is None:
        if algo in _RANDOM_SEEDED:
            raise IndexConfigError(
                f"{algo} needs the fleet's PYTHONHASHSEED as the seed: without it every "
                "vLLM process draws a random seed and its block hashes cannot be computed; "
                "set PYTHONHASHSEED to one value on every engine and give the index the same"
            )
        return DEFAULT_SEED
    # Python refuses to start with any other non-empty value, so no engine can have it;
    # an empty one Python ignores while vLLM still reads it.
    valid = seed in ("", "random") or (
        _HASH_SEED.fullmatch(seed) is not None and 0 <= int(seed) <= _MAX_HASH_SEED
    )
    if not valid:
        raise IndexConfigError(
            f"hash seed {seed!r} cannot be a PYTHONHASHSEED: give the engines' value, "
            f'"random" or an integer from 0 to {_MAX_HASH_SEED}'
        )
    return seed


@dataclass(frozen=True)
class BlockHasher:
    """Computes an engine's block hashes from token ids, for one fleet configuration.

    `algo` is the engines' `--prefix-caching-hash-algo`, `seed` their `PYTHONHASHSEED`
    (None when it is unset). Both are checked here, and NONE_HASH is computed once, so
    `block_hashes` does only the per-block work.
    """

    algo: str = "sha256"
    """vLLM's `--prefix-caching-hash-algo` of the engines: one of `ALGOS`."""
    seed: str | None = None
    """The engines' `PYTHONHASHSEED`; None when unset (then the xxhash algos cannot work)."""
    _serialize: Serializer = field(init=False, repr=False, compare=False)
    _new_hash: Callable[[bytes], _Hash] = field(init=False, repr=False, compare=False)
    _none_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise IndexConfigError(
                f"unknown hash algorithm {self.algo!r}: use the engines' "
                f"--prefix-caching-hash-algo, one of {', '.join(ALGOS)}"
            )
        serialize, new_hash = _serializer(self.algo), _hash_constructor(self.algo)
        none_hash = new_hash(serialize(_none_hash_seed(self.algo, self.seed))).digest()
        object.__setattr__(self, "_serialize", serialize)
        object.__setattr__(self, "_new_hash", new_hash)
        object.__setattr__(self, "_none_hash", none_hash)

    def block_hashes(
        self,
        token_ids: Sequence[int],
        block_size: int,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        cache_salt: str | None = None,
    ) -> list[int]:
        """The published (UInt64) hashes of the full blocks of a prompt, in order.

        `block_size` is the engines' block size in tokens; a partial last block has no
        hash. A LoRA request needs both the adapter's name and the path the engines
        loaded it from (vLLM hashes both); `cache_salt` is the request's salt, if any.
        Token ids may be any ints, numpy's included (TypeError for anything else).
        """
        if block_size < 1:
            raise IndexConfigError(f"block size must be at least 1 token, not {block_size}")
        tokens = tuple(map(operator.index, token_ids))
        lora = _lora_keys(lora_name, lora_path)
        first: tuple[tuple[str, ...], ...] | None = lora
        if cache_salt:
            first = (*(lora or ()), ("cache_salt", cache_salt))
        serialize, new_hash = self._serialize, self._new_hash  # C calls only in the loop
        parent = self._none_hash
        digests = []
        extra = first
        for start in range(0, len(tokens) - block_size + 1, block_size):
            parent = new_hash(
                serialize((parent, tokens[start : start + block_size], extra))
            ).digest()
            digests.append(parent)
            extra = lora
        return list(map(normalize_hash, digests))


def _lora_keys(name: str | None, path: str | None) -> tuple[tuple[str, ...], ...] | None:
    """The LoRA extra key vLLM puts on every block of a LoRA request, or None without one."""
    if name is None and path is None:
        return None
    if not name or not path:
        raise IndexConfigError(
            "a LoRA request's hashes need both the adapter's name and the path the engines "
            f"loaded it from (--lora-modules NAME=PATH); got name={name!r}, path={path!r}"
        )
    return (("lora", name, path),)

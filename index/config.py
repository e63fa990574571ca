"""`IndexConfig`: everything `kvscope index` is told, validated before anything starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kvscope.common.kafka import KafkaSettings
from kvscope.common.net import open_listener_problem, token_problem
from kvscope.index.errors import IndexConfigError
from kvscope.schemas import DEFAULT_TOPIC_PREFIX
from kvscope.schemas.streams import topic_prefix_problem

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {
    "GPU": 1.0,
    "CPU": 0.8,
    "DISK": 0.5,
    "EXTERNAL": 0.5,
    "UNKNOWN": 0.5,
}
"""Score per matched block by the tier holding it (llm-d's defaults: GPU 1.0, CPU 0.8)."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8790
TOKEN_ENV = "KVSCOPE_INDEX_TOKEN"
"""Environment variable the token is read from when `--token` is not given."""
DEFAULT_MAX_REQUEST_TOKENS = 262_144
"""Largest prompt scored (256k tokens: above every served context length of the fleet)."""
MAX_REQUEST_TOKENS_LIMIT = 4_194_304
"""Highest --max-request-tokens (a 16 MiB body holds about this many small ids)."""
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
"""vLLM's `--prefix-caching-hash-algo` choices."""


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """Config of one index process (flags of `kvscope index` read their defaults here)."""

    kafka: KafkaSettings
    """Where the kv-events topic is."""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    """Topic prefix of kvscope's streams (the kv-events topic is `{prefix}kv-events`)."""
    clickhouse: str | None = dataclasses.field(default=None, repr=False)
    """Stored state to start from (None: read the topic from its beginning)."""
    host: str = DEFAULT_HOST
    """HTTP listen address; anything but loopback needs a token."""
    port: int = DEFAULT_PORT
    """HTTP port (0: any free port)."""
    token: str | None = dataclasses.field(default=None, repr=False)
    """Bearer token every request but /healthz must carry (None: loopback only)."""
    tier_weights: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS)
    )
    """Score of a matched block by the tier holding it (GPU above CPU above disk/remote)."""
    hash_algo: str = "sha256"
    """The fleet's `--prefix-caching-hash-algo`, to hash token ids as the engines do."""
    hash_seed: str | None = None
    """The fleet's PYTHONHASHSEED (None: vLLM's default seed for the sha256 algorithms)."""
    routed_ttl_s: float = 2.0
    """Lifetime of a routed hint, seconds."""
    max_body_bytes: int = 16 << 20
    """Largest request body, refused with a 413 while read (a /score of 1M token ids fits)."""
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    """Largest request of /score and /routed, in token ids (or block hashes): 413 above."""
    source_idle_expiry_s: float | None = None
    """Forget a source that published nothing for this long (None: never; opt-in)."""
    disconnected_grace_s: float = 30.0
    """How long the router's in-process index is trusted while disconnected from Kafka."""

    @property
    def topic(self) -> str:
        """The kv-events topic."""
        return f"{self.topic_prefix}kv-events"

    def validate(self) -> IndexConfig:
        """Raise `IndexConfigError` naming the flag of the first bad value."""
        try:
            self.kafka.validate()
        except ValueError as exc:
            raise IndexConfigError(str(exc)) from None
        problem = topic_prefix_problem(self.topic_prefix)
        if problem:
            raise IndexConfigError(problem)
        if not 0 <= self.port < 65536:
            raise IndexConfigError(f"--port must be 0..65535, got {self.port}")
        problem = token_problem(self.token) or open_listener_problem(
            self.host, self.token, TOKEN_ENV, "read"
        )
        if problem:
            raise IndexConfigError(problem)
        if self.hash_algo not in HASH_ALGOS:
            raise IndexConfigError(
                f"--hash-algo must be one of {', '.join(HASH_ALGOS)}, got {self.hash_algo!r}"
            )
        if not 0 < self.routed_ttl_s <= 3600:
            raise IndexConfigError(f"--routed-ttl must be in (0, 3600] s, got {self.routed_ttl_s}")
        if not 1 <= self.max_request_tokens <= MAX_REQUEST_TOKENS_LIMIT:
            raise IndexConfigError(
                f"--max-request-tokens must be 1..{MAX_REQUEST_TOKENS_LIMIT:,}, "
                f"got {self.max_request_tokens}"
            )
        if self.source_idle_expiry_s is not None and not self.source_idle_expiry_s > 0:
            raise IndexConfigError(
                f"--source-idle-expiry must be > 0 s, got {self.source_idle_expiry_s}"
            )
        if not self.disconnected_grace_s >= 0:
            raise IndexConfigError(
                f"the disconnected grace must be >= 0 s, got {self.disconnected_grace_s}"
            )
        for tier, weight in self.tier_weights.items():
            if not 0 <= weight <= 1e6:
                raise IndexConfigError(f"--tier-weight {tier}={weight}: must be 0..1e6")
        return self


def parse_tier_weights(items: list[str]) -> dict[str, float]:
    """`GPU=1,CPU=0.8` style flags over the defaults (IndexConfigError on a bad one)."""
    weights = dict(DEFAULT_TIER_WEIGHTS)
    for item in items:
        for part in item.split(","):
            tier, sep, value = part.partition("=")
            try:
                weights[tier.strip().upper()] = float(value)
            except ValueError:
                sep = ""
            if not sep or not tier.strip():
                raise IndexConfigError(
                    f"--tier-weight {part!r}: expected TIER=WEIGHT, e.g. CPU=0.8"
                ) from None
    return weights

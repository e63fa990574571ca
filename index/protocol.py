"""The index's contract with its clients: request and answer types, msgspec Structs only.

`kvscope index` (HTTP), the router (over HTTP or with the index in process) and the fleet
simulator all speak these types; none of them re-declares them. This module imports
nothing but msgspec, so a router in HTTP mode loads no numba (as Dynamo keeps its
indexer/router messages in one `protocols.rs`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
"""A count or an id that cannot be negative."""


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /score: the request's block hashes, or its token ids and model."""

    block_hashes: list[NonNegative] | None = None
    """Unsigned 64-bit block hashes, as kvscope stores them."""
    token_ids: list[NonNegative] | None = None
    """The prompt's token ids (with `model`: hashed as the model's engines hash them)."""
    model: str | None = None
    """The served model name: whose sources are scored, and their block size."""
    lora_name: str | None = None
    """The LoRA adapter the request names (its blocks hash apart from the base model's)."""
    lora_path: str | None = None
    """The adapter's path, where the engine keys LoRA by path."""
    cache_salt: str | None = None
    """vLLM's per-request `cache_salt` (salts the first block's hash)."""


class RoutedRequest(ScoreRequest, forbid_unknown_fields=True):
    """Body of POST /routed: a score request plus the source it was sent to."""

    instance: str = ""
    """The engine instance the router sent the request to."""
    dp_rank: NonNegative = 0
    """Its data-parallel rank."""


class SourceScore(msgspec.Struct, frozen=True, gc=False):
    """One source's answer to a score request (a Struct: built per source per request)."""

    instance: str
    dp_rank: int = 0
    matched_blocks: int = 0
    """Leading blocks of the request the source holds (confirmed, then routed hints)."""
    matched_tokens: int = 0
    score: float = 0.0
    """Sum over matched blocks of the best weight of a tier holding each."""
    stale: bool = False
    """The index does not trust what it knows of this source (a gap in its events)."""
    speculative_blocks: int = 0
    """Of `matched_blocks`, those known only from routed hints."""
    model: str = ""


class ScoreResult(msgspec.Struct, frozen=True):
    """The answer to a score request: every candidate source, best first, and the lag."""

    lag_s: float = 0.0
    """Seconds from the newest applied record's engine timestamp to the answer."""
    sources: list[SourceScore] = msgspec.field(default_factory=list)
    ready: bool = True
    """Whether the index has read its feed to the end and is still reading it. False: it
    answers from what it knows (still exact as of `lag_s` ago), and a router should not
    trust the answer for affinity (it routes by load; docs/routing.md)."""

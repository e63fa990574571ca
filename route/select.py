"""Choosing an engine: cache affinity from the index against load, pure computation.

The shape follows llm-d's and Dynamo's scorers: each candidate gets
`affinity * hit - (1 - affinity) * load`, where `hit` is the share of the prompt's tokens the
index says the engine holds (0..1) and `load` its in-flight requests relative to the busiest
candidate (0..1). The highest value wins; equal values go to the less loaded engine, then
take turns (`turn`), so a fleet with nothing cached is served round-robin. The rule itself
is `kvscope.cachemodel.scoring.best` (the access replay routes by it too).

Candidates: engines that are up, not stalled (`engines.Fleet`), and whose index source is
fresh. A stale source (the index saw a gap in its events) is not trusted, and a stalled
engine would hold its prefix's traffic however loaded it gets (the load term is capped at
`1 - affinity`): such an engine is skipped while another is up, and when none is, the up
engines are chosen by load alone. The router changes what it feeds the rule, never the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvscope.cachemodel.scoring import best
from kvscope.route.errors import NoEngineUp


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One engine as the selection sees it."""

    name: str
    """The engine's instance name."""
    in_flight: int
    """Requests the router has sent it that have not finished."""
    matched_tokens: int = 0
    """Leading prompt tokens the index says it holds (its best dp rank)."""
    dp_rank: int = 0
    """The dp rank holding `matched_tokens`."""
    stale: bool = False
    """The index does not trust what it knows of this engine."""
    up: bool = True
    """Not marked down by a failed request or health check, nor ejected."""
    stalled: bool = False
    """No first byte for a while although other engines answer (`engines.Fleet`)."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """The engine chosen for one request and what the index predicted."""

    name: str
    """The chosen engine."""
    dp_rank: int
    """Its dp rank that holds the predicted hit (0 when nothing matched)."""
    matched_tokens: int
    """Predicted hit tokens on the chosen engine."""
    best_tokens: int
    """The most hit tokens any candidate offered (>= matched_tokens: the gap is what load
    cost in cache affinity)."""


def choose(
    candidates: Sequence[Candidate], prompt_tokens: int, affinity: float, turn: int = 0
) -> Decision:
    """The best candidate for a prompt of `prompt_tokens` tokens (see the module docstring).

    Raises `NoEngineUp` when no candidate is up.
    """
    up = [c for c in candidates if c.up]
    if not up:
        raise NoEngineUp("no engine is up")
    fresh = [c for c in up if not c.stale and not c.stalled]
    pool = fresh or [dataclasses.replace(c, matched_tokens=0, dp_rank=0) for c in up]
    k = best([c.matched_tokens for c in pool], [c.in_flight for c in pool], prompt_tokens,
             affinity, turn)  # fmt: skip
    chosen = pool[k]
    return Decision(
        name=chosen.name,
        dp_rank=chosen.dp_rank,
        matched_tokens=chosen.matched_tokens,
        best_tokens=max(c.matched_tokens for c in pool),
    )

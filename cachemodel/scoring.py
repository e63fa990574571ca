"""The rule `kvscope route` chooses an engine by: cache affinity against load, pure computation.

Each candidate gets `affinity * hit - (1 - affinity) * load`, where `hit` is the share of
the prompt's tokens it holds (0..1) and `load` its in-flight requests relative to the
busiest candidate (0..1); the highest value wins, equal values go to the less loaded, then
take turns. It lives here, beside the access replay that routes by it too, so the what-if
of a fleet behind `kvscope route` re-routes exactly as the router would.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_AFFINITY = 0.8
"""`kvscope route --affinity`'s default: cache affinity weighs four times the load."""


def best(
    matched_tokens: Sequence[int],
    in_flight: Sequence[int],
    prompt_tokens: int,
    affinity: float,
    turn: int = 0,
) -> int:
    """Index of the candidate the rule picks (`matched_tokens[i]` leading prompt tokens held
    and `in_flight[i]` requests, for a prompt of `prompt_tokens`); at least one candidate."""
    busiest = max(max(in_flight), 1)
    size = max(prompt_tokens, 1)
    values = [
        affinity * min(m / size, 1.0) - (1.0 - affinity) * (load / busiest)
        for m, load in zip(matched_tokens, in_flight, strict=True)
    ]
    top = max(values)
    tied = [i for i, v in enumerate(values) if v >= top - 1e-12]
    least = min(in_flight[i] for i in tied)
    tied = [i for i in tied if in_flight[i] == least]
    return tied[turn % len(tied)]

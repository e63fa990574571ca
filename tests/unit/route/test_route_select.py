"""The engine choice (`kvscope.route.select.choose`), swept over fleet shapes."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from kvscope.route.errors import NoEngineUp
from kvscope.route.select import Candidate, choose


def fleet(rng: random.Random, size: int, prompt: int) -> list[Candidate]:
    """`size` engines with random load, cached prefix, dp rank, staleness and health."""
    return [
        Candidate(
            name=f"e{i}",
            in_flight=rng.randint(0, 8),
            matched_tokens=rng.choice([0, rng.randint(0, prompt)]),
            dp_rank=rng.randint(0, 3),
            stale=rng.random() < 0.2,
            up=rng.random() < 0.85,
        )
        for i in range(size)
    ]


@pytest.mark.parametrize("size", [1, 2, 3, 8, 32])
@pytest.mark.parametrize("prompt", [1, 31, 512, 8192])
def test_full_affinity_takes_the_longest_fresh_prefix_then_the_least_load(
    size: int, prompt: int
) -> None:
    rng = random.Random(size * 7919 + prompt)
    for turn in range(60):
        candidates = fleet(rng, size, prompt)
        fresh = [c for c in candidates if c.up and not c.stale]
        if not fresh:
            continue
        decision = choose(candidates, prompt, affinity=1.0, turn=turn)
        most = max(c.matched_tokens for c in fresh)
        holders = [c for c in fresh if c.matched_tokens == most]
        least = min(c.in_flight for c in holders)
        chosen = next(c for c in candidates if c.name == decision.name)
        assert chosen in holders and chosen.in_flight == least
        assert (decision.matched_tokens, decision.best_tokens) == (most, most)
        assert decision.dp_rank == chosen.dp_rank


@pytest.mark.parametrize("size", [1, 2, 5, 16])
def test_zero_affinity_is_least_loaded(size: int) -> None:
    rng = random.Random(size)
    for turn in range(60):
        candidates = fleet(rng, size, 256)
        fresh = [c for c in candidates if c.up and not c.stale]
        if not fresh:
            continue
        decision = choose(candidates, 256, affinity=0.0, turn=turn)
        chosen = next(c for c in candidates if c.name == decision.name)
        assert chosen in fresh
        assert chosen.in_flight == min(c.in_flight for c in fresh)
        assert decision.best_tokens == max(c.matched_tokens for c in fresh)
        assert decision.best_tokens >= decision.matched_tokens


@pytest.mark.parametrize("affinity", [0.1, 0.3, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("hit", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("load", [0, 1, 4, 64])
def test_affinity_against_load_between_a_holder_and_an_idle_engine(
    affinity: float, hit: float, load: int
) -> None:
    prompt = 1000
    holder = Candidate("holder", in_flight=load, matched_tokens=int(hit * prompt))
    idle = Candidate("idle", in_flight=0)
    decision = choose([holder, idle], prompt, affinity)
    # value(holder) = a*hit - (1-a)*(load/busiest); value(idle) = 0; a tie goes to the idler,
    # and a tie at equal load takes turns.
    holder_value = affinity * hit - (1 - affinity) * (1.0 if load else 0.0)
    if abs(holder_value) < 1e-9 and load == 0:
        names = {choose([holder, idle], prompt, affinity, turn).name for turn in (0, 1)}
        assert names == {"holder", "idle"}
    else:
        assert decision.name == ("holder" if holder_value > 1e-9 else "idle")
    assert decision.best_tokens == int(hit * prompt)
    forgone = decision.best_tokens - decision.matched_tokens
    assert forgone == (0 if decision.name == "holder" else int(hit * prompt))


@pytest.mark.parametrize("size", [2, 3, 7])
def test_nothing_cached_and_equal_load_takes_turns(size: int) -> None:
    candidates = [Candidate(f"e{i}", in_flight=2) for i in range(size)]
    chosen = Counter(choose(candidates, 100, 0.8, turn).name for turn in range(size * 5))
    assert chosen == {f"e{i}": 5 for i in range(size)}


def test_stale_sources_are_skipped_while_a_fresh_engine_is_up() -> None:
    stale = Candidate("stale", in_flight=0, matched_tokens=900, stale=True)
    fresh = Candidate("fresh", in_flight=3, matched_tokens=0)
    assert choose([stale, fresh], 1000, 1.0).name == "fresh"
    # With no fresh engine left, the stale ones are chosen by load alone (scores untrusted).
    other = Candidate("other", in_flight=0, matched_tokens=0, stale=True)
    busy = Candidate("stale", in_flight=5, matched_tokens=900, stale=True)
    decision = choose([busy, other], 1000, 1.0)
    assert (decision.name, decision.matched_tokens, decision.best_tokens) == ("other", 0, 0)


@pytest.mark.parametrize("size", [1, 3, 6])
def test_down_engines_are_never_chosen(size: int) -> None:
    rng = random.Random(size)
    for turn in range(40):
        candidates = fleet(rng, size, 64)
        if not any(c.up for c in candidates):
            with pytest.raises(NoEngineUp):
                choose(candidates, 64, 0.5, turn)
            continue
        name = choose(candidates, 64, 0.5, turn).name
        assert next(c for c in candidates if c.name == name).up


def test_no_candidate_at_all_is_no_engine_up() -> None:
    with pytest.raises(NoEngineUp):
        choose([], 10, 0.8)

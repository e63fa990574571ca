"""The access replay's re-routings: round-robin takes turns; one guessing router that sees all
traffic (prompt blocks only) routes as the exact one; guessing replicas, each seeing a share
of the traffic, fall behind exact routing."""

from __future__ import annotations

import random

import pytest
from kvscope.cachemodel.access_replay import Access, replay
from kvscope.cachemodel.whatif import levers


def chats(seed: int, n_chats: int, turns: int, sources: int) -> list[Access]:
    """Multi-turn chats (each turn extends its chat's prompt by a block), turns interleaved
    at random, first served round-robin; prompts only (no generated blocks)."""
    rng = random.Random(seed)
    history = {c: [rng.getrandbits(63) for _ in range(turns + 2)] for c in range(n_chats)}
    pending = {c: 0 for c in range(n_chats)}
    out: list[Access] = []
    t = 0
    while pending:
        c = rng.choice(sorted(pending))
        blocks = history[c][: pending[c] + 2]
        t += 1_000
        out.append(
            Access(
                source=f"e{len(out) % sources}/0",
                role="both",
                arrival_us=t,
                lookup_us=t,
                free_us=t + 12_000,  # about 12 requests in flight: load matters
                prompt_tokens=16 * len(blocks),
                block_size=16,
                hit_blocks=0,
                held_blocks=len(blocks),
                hashes=blocks,
            )
        )
        pending[c] += 1
        if pending[c] == turns:
            del pending[c]
    return out


def _rate(results: dict) -> float:
    return sum(r.hits for r in results.values()) / sum(r.queries for r in results.values())


@pytest.mark.parametrize("sources", [2, 3, 5])
def test_round_robin_takes_turns_in_each_group(sources: int) -> None:
    accesses = chats(1, 20, 3, sources)
    results = replay(accesses, {f"e{i}/0": 1000 for i in range(sources)}, "round-robin")
    counts = [r.requests for r in results.values()]
    assert max(counts) - min(counts) <= 1 and sum(counts) == len(accesses)


@pytest.mark.parametrize(("seed", "sources"), [(1, 2), (2, 3), (3, 4), (4, 3)])
def test_one_guesser_seeing_all_traffic_routes_as_the_exact_router(seed: int, sources: int) -> None:
    accesses = chats(seed, 15, 4, sources)
    huge = {f"e{i}/0": 100_000 for i in range(sources)}
    exact = replay(accesses, huge, "prefix-aware")
    guessed = replay(accesses, huge, "approximate", router_replicas=1)
    assert [(r.hits, r.requests) for r in exact.values()] == [
        (r.hits, r.requests) for r in guessed.values()
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_guessing_replicas_fall_behind_exact_routing(seed: int) -> None:
    accesses = chats(seed, 40, 5, 3)
    small = {f"e{i}/0": 24 for i in range(3)}
    exact = _rate(replay(accesses, small, "prefix-aware"))
    guessed = _rate(replay(accesses, small, "approximate"))
    round_robin = _rate(replay(accesses, small, "round-robin"))
    assert exact > guessed and exact > round_robin
    figures = levers(accesses, [], small, {})
    assert figures.router - figures.guesser == pytest.approx(exact - guessed)
    assert figures.router - figures.round_robin == pytest.approx(exact - round_robin)

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


@pytest.mark.parametrize(("seed", "sources"), [(1, 2), (2, 3), (5, 4)])
@pytest.mark.parametrize("affinity", [0.5, 0.8, 1.0])
def test_replay_by_the_route_scorer_picks_as_kvscope_route_does(
    seed: int, sources: int, affinity: float
) -> None:
    """Re-routed by `kvscope route`'s scorer (`affinity`), every request is placed, and cold
    prefixes with equal loads take turns where the simulator's router sends them all to
    the first source."""
    accesses = chats(seed, 12, 4, sources)
    sizes = {f"e{i}/0": 30 for i in range(sources)}
    results = replay(accesses, sizes, "prefix-aware", affinity=affinity)
    assert sum(r.requests for r in results.values()) == len(accesses)
    # prefixes cached nowhere, one request at a time (equal loads): turns, not the first
    cold = [Access(f"e{n % sources}/0", "both", 100 * n, 100 * n, 100 * n + 50, 32, 16, 0, 2,
                   [1000 + 2 * n, 1001 + 2 * n]) for n in range(2 * sources)]  # fmt: skip
    turns = replay(cold, sizes, "prefix-aware", affinity=affinity)
    assert sorted(r.requests for r in turns.values()) == [2] * sources
    simulator_rule = replay(cold, sizes, "prefix-aware")
    assert simulator_rule["e0/0"].requests == 2 * sources


@pytest.mark.parametrize("capacity", [3, 4, 6, 9])
def test_a_vllm_pool_lacks_its_null_block(capacity: int) -> None:
    """vLLM's reported capacity counts its null block: a request of `capacity` blocks
    re-sent after another of the same size hits at `capacity - 1` usable blocks as the
    real engine does, while simulator data keeps every block."""

    def accesses(engine: str) -> list[Access]:
        blocks = [[100 + i for i in range(capacity - 1)], [900]]
        out = []
        for n, hashes in enumerate([blocks[0], blocks[1], blocks[0]]):
            t = 1_000 * (n + 1)
            out.append(Access("e0/0", "both", t, t, t + 10, 16 * len(hashes) + 1, 16, 0,
                              len(hashes) + 1, hashes, engine=engine))  # fmt: skip
        return out

    def hit_blocks(engine: str) -> int:
        return replay(accesses(engine), {"e0/0": capacity})["e0/0"].hits // 16

    # capacity - 1 prompt blocks + 1 partial, then 1 + 1 partial: on `capacity` usable
    # blocks the second request evicts one of the first's; on capacity - 1 it evicts more
    assert hit_blocks("simulator") > hit_blocks("vllm")


@pytest.mark.parametrize(("seed", "sources", "engine"), [(1, 2, "vllm"), (2, 3, "simulator")])
def test_rerouted_gains_add_up_to_the_fleets_replayed_gain(
    seed: int, sources: int, engine: str
) -> None:
    """Chats kept on one source each look prefix-aware routed; re-routed, requests move
    between sources, and the per-source gains times each source's observed queries still
    add up to the fleet's replayed hits at the larger size minus at today's."""
    from kvscope.cachemodel.whatif import replay_gains, router_affinity

    accesses = chats(seed, 30, 5, sources)
    for a in accesses:
        a.source, a.engine = f"e{a.hashes[0] % sources}/0", engine
    capacity = {f"e{i}/0": 20 for i in range(sources)}
    extras = {f: {k: round(v * f) for k, v in capacity.items()} for f in (0.5, 1.0)}
    method, gains = replay_gains(accesses, [], capacity, extras)
    assert method == "access-replay-rerouted"
    affinity = router_affinity(accesses)
    assert (affinity is None) == (engine == "simulator")
    observed = {k: sum(a.prompt_tokens for a in accesses if a.source == k) for k in capacity}
    base = replay(accesses, capacity, "prefix-aware", affinity=affinity)
    for f, extra in extras.items():
        sizes = {k: v + extra[k] for k, v in capacity.items()}
        bigger = replay(accesses, sizes, "prefix-aware", affinity=affinity)
        fleet = sum(bigger[k].hits - base[k].hits for k in capacity)
        assert sum(gains[(k, f)] * observed[k] for k in capacity) == pytest.approx(fleet)

"""A part of a window is replayed from the state the caches had when it began.

The report's halves were replayed from cold caches, so the second half missed what the
first had cached and both halves could need more memory than the whole window (a warm
part is not always hit more: requests in flight at its start hold blocks). Counting
only the accesses from a moment on, with the earlier ones filling the pools, splits the
whole window's replay exactly: the parts add up to it, whatever the routing."""

from __future__ import annotations

import pytest
from kvscope.cachemodel.access_replay import ROUTINGS, replay
from kvscope.cachemodel.whatif import replay_gains
from test_replay_routings import chats


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize(("seed", "sources", "capacity"), [(1, 1, 12), (2, 2, 20), (3, 3, 8)])
def test_the_parts_of_a_window_add_up_to_the_whole(
    routing: str, seed: int, sources: int, capacity: int
) -> None:
    accesses = chats(seed, n_chats=12, turns=6, sources=sources)
    sizes = {f"e{i}/0": capacity for i in range(sources)}
    middle = accesses[len(accesses) // 2].arrival_us
    whole = replay(accesses, sizes, routing)
    later = replay(accesses, sizes, routing, count_from_us=middle)
    earlier = replay([a for a in accesses if a.arrival_us < middle], sizes, routing)
    for s in sizes:
        assert later[s].queries + earlier[s].queries == whole[s].queries
        assert later[s].hits + earlier[s].hits == whole[s].hits
        assert later[s].requests + earlier[s].requests == whole[s].requests


@pytest.mark.parametrize("seed", [4, 5])
def test_gains_count_only_the_part(seed: int) -> None:
    accesses = chats(seed, n_chats=10, turns=5, sources=2)
    sizes = {"e0/0": 10, "e1/0": 10}
    extras = {0.5: {"e0/0": 5, "e1/0": 5}}
    middle = accesses[len(accesses) // 3].arrival_us
    _, gains = replay_gains(accesses, [], sizes, extras, count_from_us=middle)
    base = replay(accesses, sizes, count_from_us=middle)
    bigger = replay(accesses, {k: 15 for k in sizes}, count_from_us=middle)
    for s in sizes:
        observed = sum(
            a.prompt_tokens for a in accesses if a.source == s and a.arrival_us >= middle
        )
        assert gains[(s, 0.5)] * observed == pytest.approx(bigger[s].hits - base[s].hits)

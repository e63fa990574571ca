"""`settle_clears`: a clear stamped with its KV-event batch's time moves back to the idle
moment the engine performed it in; one stamped while idle stays."""

from __future__ import annotations

import random

import pytest
from kvscope.cachemodel.access_replay import Access, replay, settle_clears


def access(source: str, lookup_us: int, free_us: int, hashes: list[int]) -> Access:
    """A request of `len(hashes)` full blocks of 16 tokens plus one token."""
    return Access(
        source=source,
        role="both",
        arrival_us=lookup_us,
        lookup_us=lookup_us,
        free_us=free_us,
        prompt_tokens=16 * len(hashes) + 1,
        block_size=16,
        hit_blocks=0,
        held_blocks=len(hashes) + 1,
        hashes=hashes,
    )


@pytest.mark.parametrize("seed", range(6))
def test_a_clear_stamped_after_admissions_moves_before_them(seed: int) -> None:
    rng = random.Random(seed)
    prefix = [rng.getrandbits(63) for _ in range(rng.randint(1, 5))]
    idle_until = rng.randint(100, 10_000)
    before = [access("e/0", 10, idle_until - rng.randint(0, 50), prefix)]
    # after the real clear: the first request misses, the next ones share its prefix
    starts = sorted(rng.sample(range(idle_until + 1, idle_until + 500), rng.randint(2, 6)))
    after = [access("e/0", t, t + 10_000, [*prefix, rng.getrandbits(63)]) for t in starts]
    stamped = starts[-1] + rng.randint(1, 100)  # the batch after the admissions
    accesses = [*before, *after]
    settled = settle_clears(accesses, [("e/0", stamped)])
    assert settled == [("e/0", starts[0] - 1)]
    result = replay(accesses, {"e/0": 64}, "fixed", settled)["e/0"]
    shared = 16 * len(prefix)
    assert result.hits == shared * (len(after) - 1)
    as_stamped = replay(accesses, {"e/0": 64}, "fixed", [("e/0", stamped)])["e/0"]
    assert as_stamped.hits == shared * len(after), "unsettled, the clear comes too late"


@pytest.mark.parametrize("gap", [1, 7, 1000])
def test_a_clear_stamped_while_idle_stays(gap: int) -> None:
    accesses = [access("e/0", 10, 100, [1, 2]), access("e/1", 50, 10_000, [3])]
    clears = [("e/0", 100 + gap), ("e/1", 10_000 + gap), ("other/0", 60)]
    assert settle_clears(accesses, clears) == clears


def test_each_source_settles_on_its_own_requests() -> None:
    accesses = [access("a/0", 100, 200, [1]), access("b/0", 150, 900, [2])]
    assert settle_clears(accesses, [("a/0", 180), ("b/0", 180)]) == [
        ("a/0", 99),
        ("b/0", 149),
    ]

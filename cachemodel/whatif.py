"""The what-if math over an access stream: the hit rate more KV blocks, or a prefix-aware
router, would have given, by replaying the accesses through the LRU block pool.

Pure computation: `kvscope.analytics.whatif` feeds it stored accesses, the simulator's
what-if check feeds it the simulated fleet's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvscope.cachemodel.access_replay import Access, SourceResult, detect_routing, replay

WHAT_IF_FRACTIONS = (0.1, 0.25, 0.5, 1.0)
"""Extra capacity (fractions of each source's blocks) the what-if predicts by default."""
ERROR_PP = {
    "access-replay": 0.5,
    "access-replay-rerouted": 2.0,
    "refault-corrected": 17.0,
}
"""Error range of each method in points: the worst |prediction - re-run| measured over the
workload sweep of tests/unit/collector/test_whatif_sweep.py, rounded up (docs/analytics.md)."""
REAL_ENGINE_ERROR_PP = {"access-replay": 1.5, "access-replay-rerouted": 16.0}
"""Error range in points where the accesses come from real engines: the worst |prediction -
measured| of bench/whatif_real.py (vLLM CPU engines at 1.5x and 2x the blocks of the run
predicted from), rounded up. Larger than on the simulator: a real engine's timing, and so
what its running requests pin, differs from run to run (docs/benchmarks.md). Re-routed
replay of a fleet behind `kvscope route` missed by up to 15.2 points (bench/whatif_routed.py:
the replay re-routes with the simulator's router, not the real router's scorer), so real
routed fleets get that range until the replay follows the real router."""


def error_range(method: str, engines: Iterable[str] = ()) -> float:
    """The error range of `method` for data published by `engines`: the simulator sweep's,
    or for real engines the real-engine measurement (a method not measured on real engines
    takes the larger of its simulator range and the real access replay's)."""
    if all(engine in ("", "simulator") for engine in engines):
        return ERROR_PP[method]
    real = REAL_ENGINE_ERROR_PP["access-replay"]
    return REAL_ENGINE_ERROR_PP.get(method, max(ERROR_PP[method], real))


def replay_gains(
    accesses: list[Access],
    clears: list[tuple[str, int]],
    capacity: Mapping[str, int],
    extras: Mapping[float, Mapping[str, int]],
) -> tuple[str, dict[tuple[str, float], float]]:
    """The method, and per (source, fraction) the hit-rate gain of `extras[fraction][source]`
    more blocks: replayed hits at the larger size minus at the observed size, per query token.
    """
    routing = detect_routing(accesses, capacity)
    base = replay(accesses, capacity, routing, clears)
    gains: dict[tuple[str, float], float] = {}
    for fraction, extra in sorted(extras.items()):
        sizes = {k: v + extra.get(k, 0) for k, v in capacity.items()}
        bigger = replay(accesses, sizes, routing, clears)
        for k in capacity:
            q = base[k].queries
            gains[(k, fraction)] = (bigger[k].hits - base[k].hits) / q if q else 0.0
    return ("access-replay" if routing == "fixed" else "access-replay-rerouted"), gains


@dataclass(frozen=True)
class Levers:
    """Fleet hit-rate gains (fractions) of the two levers and both, from the access replay."""

    routing: str
    """The routing the data looks like (`fixed` or `prefix-aware`)."""
    router: float
    """A prefix-aware router at today's capacity."""
    memory: float
    """`extra` blocks per source with today's routing."""
    both: float
    """A prefix-aware router and `extra` blocks."""
    round_robin: float = 0.0
    """A round-robin router at today's capacity."""
    guesser: float = 0.0
    """Guessing prefix routers (`approximate`: `GUESSING_REPLICAS` replicas, each routing by
    its own decisions, no evictions seen) at today's capacity. `router - guesser` is what
    exact routing adds over guessing."""


def levers(
    accesses: list[Access],
    clears: list[tuple[str, int]],
    capacity: Mapping[str, int],
    extra: Mapping[str, int],
) -> Levers:
    """Router alone, memory alone and both, each against a replay of today's fleet."""
    routing = detect_routing(accesses, capacity)
    bigger = {k: v + extra.get(k, 0) for k, v in capacity.items()}
    today = _rate(replay(accesses, capacity, routing, clears))
    return Levers(
        routing=routing,
        router=_rate(replay(accesses, capacity, "prefix-aware", clears)) - today,
        memory=_rate(replay(accesses, bigger, routing, clears)) - today,
        both=_rate(replay(accesses, bigger, "prefix-aware", clears)) - today,
        round_robin=_rate(replay(accesses, capacity, "round-robin", clears)) - today,
        guesser=_rate(replay(accesses, capacity, "approximate", clears)) - today,
    )


def _rate(results: Mapping[str, SourceResult]) -> float:
    queries = sum(r.queries for r in results.values())
    return sum(r.hits for r in results.values()) / queries if queries else 0.0

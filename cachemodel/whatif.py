"""The what-if math over an access stream: the hit rate more KV blocks, or a prefix-aware
router, would have given, by replaying the accesses through the LRU block pool.

Pure computation: `kvscope.analytics.whatif` feeds it stored accesses, the simulator's
what-if check feeds it the simulated fleet's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvscope.cachemodel.access_replay import Access, SourceResult, detect_routing, replay
from kvscope.cachemodel.scoring import DEFAULT_AFFINITY

WHAT_IF_FRACTIONS = (0.1, 0.25, 0.5, 1.0)
"""Extra capacity (fractions of each source's blocks) the what-if predicts by default."""
ERROR_PP = {
    "access-replay": 0.5,
    "access-replay-rerouted": 0.5,
    "refault-corrected": 17.0,
}
"""Error range of each method in points: the worst |prediction - re-run| measured over the
workload sweep of tests/unit/simulator/test_whatif_sweep.py, rounded up (docs/analytics.md)."""
REAL_ENGINE_ERROR_PP = {"access-replay": 1.5, "access-replay-rerouted": 4.0}
"""Error range in points where the accesses come from real engines, measured on vLLM CPU
engines at 1.5x and 2x the blocks of the run predicted from (docs/benchmarks.md,
2026-11-28): the larger of the worst |prediction - re-run| and the spread between re-runs
of the same trace (a prediction is checked against one future run, which moves by that
much itself), rounded up to the half point.
- `access-replay` (requests stay where they ran): bench/whatif_real.py (one engine, two
  behind a static split) within 0.1 points, bench/whatif_routed.py's multi-turn trace (a
  router that kept every request on one engine) within 0.3 over 3 runs; those runs' 1x hit
  rates 1.0 point apart.
- `access-replay-rerouted` (a fleet behind `kvscope route`): two Zipf traces, 10 runs of
  each size, -2.4..+2.6 points; re-runs of the same trace and size up to 3.9 points apart
  (seed 5 at 2x, 4 runs)."""


def simulated(engines: Iterable[str]) -> bool:
    """Whether data published by `engines` comes from the simulator (or an unnamed engine)."""
    return all(engine in ("", "simulator") for engine in engines)


def error_range(method: str, engines: Iterable[str] = ()) -> float:
    """The error range of `method` for data published by `engines`: the simulator sweep's,
    or for real engines the real-engine measurement (a method not measured on real engines
    takes the larger of its simulator range and the real access replay's)."""
    if simulated(engines):
        return ERROR_PP[method]
    real = REAL_ENGINE_ERROR_PP["access-replay"]
    return REAL_ENGINE_ERROR_PP.get(method, max(ERROR_PP[method], real))


def error_basis(method: str, engines: Iterable[str] = ()) -> str:
    """Where `error_range(method, engines)` was measured: `real-engines` (vLLM engines re-run
    at larger caches) or `simulator` (the simulator's workload sweep)."""
    real = not simulated(engines) and method in REAL_ENGINE_ERROR_PP
    return "real-engines" if real else "simulator"


def router_affinity(accesses: Iterable[Access]) -> float | None:
    """The router a re-routing replay follows for data from these accesses' engines: the
    simulator's router for the simulator's data (what its re-runs route by), `kvscope
    route`'s scorer at its default affinity for real engines' (a fleet that looks
    prefix-aware routed is taken to be behind `kvscope route`; ties take turns there)."""
    return None if simulated(a.engine for a in accesses) else DEFAULT_AFFINITY


def replay_gains(
    accesses: list[Access],
    clears: list[tuple[str, int]],
    capacity: Mapping[str, int],
    extras: Mapping[float, Mapping[str, int]],
    count_from_us: int = 0,
) -> tuple[str, dict[tuple[str, float], float]]:
    """The method, and per (source, fraction) the hit-rate gain of `extras[fraction][source]`
    more blocks: replayed hits at the larger size minus at the observed size, per token the
    source was observed to query. Re-routed, requests move between sources, so the gains
    are per source's observed queries (not the replay's): summed over sources, the saved
    tokens are the fleet's replayed gain. `count_from_us`: only accesses arriving from then
    on count; the earlier ones fill the pools (a part of a window from the state it had)."""
    routing = detect_routing(accesses, capacity)
    affinity = router_affinity(accesses)
    base = replay(
        accesses, capacity, routing, clears, affinity=affinity, count_from_us=count_from_us
    )
    observed: dict[str, int] = {}
    for a in accesses:
        if a.arrival_us >= count_from_us:
            observed[a.source] = observed.get(a.source, 0) + a.prompt_tokens
    gains: dict[tuple[str, float], float] = {}
    for fraction, extra in sorted(extras.items()):
        sizes = {k: v + extra.get(k, 0) for k, v in capacity.items()}
        bigger = replay(
            accesses, sizes, routing, clears, affinity=affinity, count_from_us=count_from_us
        )
        for k in capacity:
            q = observed.get(k, 0)
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
    affinity: float | None = None
    """The rule of the re-routings: None the simulator's router, else `kvscope route`'s
    scorer at this affinity (`router_affinity`)."""
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
    affinity = router_affinity(accesses)

    def rate(sizes: Mapping[str, int], routed: str) -> float:
        return _rate(replay(accesses, sizes, routed, clears, affinity=affinity))

    today = rate(capacity, routing)
    return Levers(
        routing=routing,
        router=rate(capacity, "prefix-aware") - today,
        memory=rate(bigger, routing) - today,
        both=rate(bigger, "prefix-aware") - today,
        round_robin=rate(capacity, "round-robin") - today,
        guesser=rate(capacity, "approximate") - today,
        affinity=affinity,
    )


def _rate(results: Mapping[str, SourceResult]) -> float:
    queries = sum(r.queries for r in results.values())
    return sum(r.hits for r in results.values()) / queries if queries else 0.0

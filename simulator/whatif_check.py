"""How good is each capacity what-if method? Predictions from one run against re-runs.

`measure(config)` simulates `config` once, keeping its access stream (`BlockAccess`
bodies) and its truth, predicts the fleet hit rate at each extra capacity with every
method, then re-runs the simulator with that many more blocks per instance and reports
both. Methods: `access-replay` (pool replay of the accesses, re-routed when the routing
looks prefix-aware; what `capacity_what_if` reports when accesses exist), `lru-stack`
(Mattson's stack distances, pure LRU), `refault-first` and `refault-corrected` (the
events-only model of capacity_what_if.sql, computed by the truth recorder). Used by the
what-if tests and by `bench/whatif_errors.py`, which writes docs/analytics.md's table.
`measure_levers(config, fraction)` does the same for the report's three levers (router
alone, memory alone, both), against re-runs with that router, that memory, and both."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvscope.cachemodel.access_replay import Access, from_body
from kvscope.cachemodel.stack_distance import lru_hits
from kvscope.cachemodel.whatif import levers, replay_gains
from kvscope.schemas import AnyBody, BlockAccess, Source
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances, workload_requests

FRACTIONS = (0.25, 0.5, 1.0)
"""The extra capacities the what-if must get right (+25/+50/+100%)."""
METHODS = ("access-replay", "lru-stack", "refault-first", "refault-corrected")
SHARES = (0.5, 0.7, 0.9)
"""Cache sizes swept, as shares of the busiest instance's working set."""
_LONG_CHATS = {"turns": 10.0, "user_len": 96.0, "output_len": 96.0, "think_s": 3.0}


def _shape(
    instances: str, workload: str, routing: str, requests: int, **params: float
) -> SimConfig:
    return SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        routing=routing,
        requests=requests,
        workload_params=dict(params),
        seed=7,
    )


SHAPES: dict[str, SimConfig] = {
    "gsp-2-prefix-aware": _shape("2", "generated-shared-prefix", "prefix-aware", 600, groups=12),
    "gsp-4-random": _shape("4", "generated-shared-prefix", "random", 600, groups=16),
    "gsp-8-round-robin": _shape("8", "generated-shared-prefix", "round-robin", 800, groups=8),
    "chat-long-2-round-robin": _shape("2", "multi-turn", "round-robin", 400, **_LONG_CHATS),
    "chat-long-3-prefix-aware": dataclasses.replace(
        _shape("3", "multi-turn", "prefix-aware", 400, **{**_LONG_CHATS, "think_s": 1.0}),
        rate=150.0,
    ),
    "zipf-1": _shape("1", "zipf", "round-robin", 500, documents=150),
    "zipf-3-random": _shape("3", "zipf", "random", 600, documents=150),
    "pd-2p2d-round-robin": _shape("2p,2d", "generated-shared-prefix", "round-robin", 500),
}
"""The workload shapes the what-if is checked on (tests and bench/whatif_errors.py)."""
HELD_BACK = dataclasses.replace(
    _shape("5", "generated-shared-prefix", "round-robin", 3000), capacity_blocks=160, seed=0
)
"""Issue 15's held-back workload (near a cliff): the refault model was 5.7 points low at +50%."""


def sized(shape: str, share: float) -> SimConfig:
    """Shape `shape` with caches at `share` of its busiest instance's working set (but
    room for at least two of its largest requests)."""
    base = SHAPES[shape]
    reused, largest = working_set(base)
    return dataclasses.replace(base, capacity_blocks=max(math.ceil(share * reused), 2 * largest))


@dataclasses.dataclass
class Point:
    """One extra capacity: the re-run's fleet hit rate and each method's prediction."""

    fraction: float
    actual: float
    predicted: dict[str, float]

    def error_pp(self, method: str) -> float:
        """Prediction minus re-run, in percentage points."""
        return 100.0 * (self.predicted[method] - self.actual)


@dataclasses.dataclass
class Check:
    """A measured workload: its observed hit rate, replay method and points."""

    hit_rate: float
    method: str
    points: list[Point]

    def worst_pp(self, method: str) -> float:
        """The largest |error| of `method` over the points, in points."""
        return max(abs(p.error_pp(method)) for p in self.points)


def _run(config: SimConfig) -> tuple[dict[str, Any], list[Access]]:
    """Simulate `config`; its truth and its access stream."""
    accesses: list[Access] = []

    def keep(source: Source, epoch: int, body: AnyBody, ts: float) -> None:
        if isinstance(body, BlockAccess):
            accesses.append(from_body(source, body))

    truth = Fleet(dataclasses.replace(config, access_stream=True), keep).run()
    return truth, accesses


def working_set(config: SimConfig) -> tuple[int, int]:
    """(working set, largest request) in blocks, from a run where nothing is ever evicted.

    The working set is the busiest instance's reusable blocks: distinct hashes that two or
    more of its requests use (blocks used once cannot hit at any cache size)."""
    bs = config.block_size
    requests = workload_requests(config, fit_capacity=False)
    sizes = [math.ceil((len(r.prompt) + len(r.output)) / bs) for r in requests]
    _, accesses = _run(dataclasses.replace(config, capacity_blocks=sum(sizes)))
    uses: dict[str, Counter[int]] = {}
    for a in accesses:
        uses.setdefault(a.source, Counter()).update(set(a.hashes))
    reused = max(sum(1 for n in c.values() if n >= 2) for c in uses.values())
    return reused, max(sizes)


def measure(config: SimConfig, fractions: Sequence[float] = FRACTIONS) -> Check:
    """Predict with every method from one run of `config`, then re-run at each size."""
    truth, accesses = _run(config)
    cap = config.capacity_blocks
    sources = truth["sources"]
    capacity = {k: cap for k in sources}
    extras = {f: {k: math.floor(cap * f) for k in sources} for f in fractions}
    method, gains = replay_gains(accesses, [], capacity, extras)
    queries = sum(s["prefix_queries"] for s in sources.values())
    hits = sum(s["prefix_hits"] for s in sources.values())
    sizes = {k: [cap] + [cap + math.floor(cap * f) for f in fractions] for k in sources}
    lru = lru_hits(accesses, sizes)
    lru_queries = sum(a.prompt_tokens for a in accesses) or 1
    refault = {p["fraction"]: p for p in truth["fleet"]["what_if"]}
    points = []
    for i, f in enumerate(fractions):
        bigger = dataclasses.replace(config, capacity_blocks=cap + math.floor(cap * f))
        actual = Fleet(bigger).run()["fleet"]["hit_rate"]
        saved = sum(gains[(k, f)] * s["prefix_queries"] for k, s in sources.items())
        lru_gain = sum(v[i + 1] - v[0] for v in lru.values()) / lru_queries
        predicted: dict[str, Any] = {
            "access-replay": (hits + saved) / queries,
            "lru-stack": hits / queries + lru_gain,
        }
        if f in refault:
            predicted["refault-first"] = refault[f]["predicted_hit_rate"]
            predicted["refault-corrected"] = refault[f]["predicted_hit_rate_corrected"]
        points.append(Point(f, actual, predicted))
    return Check(hits / queries if queries else 0.0, method, points)


LEVERS = ("router", "memory", "both")
"""The report's levers: a prefix-aware router, more memory, and the two together."""


@dataclasses.dataclass
class LeverCheck:
    """One run's levers as the report replays them, and as re-runs of its requests give them
    (fractions of prefill-side prompt tokens, against the run's own hit rate)."""

    hit_rate: float
    predicted: dict[str, float]
    actual: dict[str, float]

    def error_pp(self, lever: str) -> float:
        """Prediction minus re-run for `lever`, in percentage points."""
        return 100.0 * (self.predicted[lever] - self.actual[lever])


def prefill_hit_rate(accesses: Sequence[Access]) -> float:
    """The hit rate of the instances that prefill (roles prefill and both), per prompt token:
    what the report's levers are gains of."""
    first = [a for a in accesses if a.role != "decode"]
    queries = sum(a.prompt_tokens for a in first)
    return sum(a.hit_blocks * a.block_size for a in first) / queries if queries else 0.0


def measure_levers(config: SimConfig, fraction: float) -> LeverCheck:
    """The report's three levers (`kvscope.cachemodel.whatif.levers` over the prefill side's
    accesses, `fraction` more blocks) from one run of `config`, and the same gains from
    re-runs of its requests: prefix-aware routing, `fraction` more blocks, both."""
    _, accesses = _run(config)
    first = [a for a in accesses if a.role != "decode"]
    cap = config.capacity_blocks
    sizes = {a.source: cap for a in first}
    extra = math.floor(cap * fraction)
    predicted = levers(first, [], sizes, {k: extra for k in sizes})
    today = prefill_hit_rate(accesses)
    reruns: dict[str, dict[str, Any]] = {
        "router": {"routing": "prefix-aware"},
        "memory": {"capacity_blocks": cap + extra},
        "both": {"routing": "prefix-aware", "capacity_blocks": cap + extra},
    }
    actual = {
        lever: prefill_hit_rate(_run(dataclasses.replace(config, **change))[1]) - today
        for lever, change in reruns.items()
    }
    gains = {"router": predicted.router, "memory": predicted.memory, "both": predicted.both}
    return LeverCheck(today, gains, actual)

"""Routing policies of the fleet simulator: which engine serves the next request.

- `round-robin` and `random`: blind to the caches.
- `oracle` (alias `prefix-aware`, its older name): reads the engines' true block pools,
  the best any cache-aware router can know (not always the best hit rate: with caches far
  below the working set, following the longest prefix can concentrate the load).
- `approximate`: the guessers' way (Gateway API inference extension's prefix scorer, PR
  #768; Dynamo's approximate mode; vLLM production-stack's prefix router): each router
  replica remembers the block hashes of the prompts it sent to each engine in a per-engine
  LRU of an assumed capacity. It never sees an eviction, nor what other replicas routed.
- `exact-index`: kvscope's prefix index fed with the KV events the fleet publishes (in
  process, or read back from Kafka by `broker_index`); before each decision it has applied
  what was published up to `index_lag_s` before it.

The cache-aware policies share one choice (`pick_best`): among engines whose load is within
`balance` of the least loaded one (otherwise one hot prefix sends everything to one
engine), the best score, then the least load, then the first. Each keeps `RoutingStats`:
what it predicted for its choices against what the chosen engine really held.
"""

from __future__ import annotations

import random
from collections import OrderedDict, defaultdict, deque
from collections.abc import Container, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvscope.cachemodel.access_replay import ROUTER_BALANCE
from kvscope.index.protocol import ScoreResult
from kvscope.schemas import AnyBody, Envelope, KVEventBatch, Source

if TYPE_CHECKING:
    from kvscope.simulator.engine import SimEngine

ROUTING = ("round-robin", "random", "approximate", "exact-index", "oracle", "prefix-aware")
"""`--routing` values; `prefix-aware` is the oracle's older name."""
ALIASES = {"prefix-aware": "oracle"}
BALANCE = ROUTER_BALANCE
"""Load slack of the cache-aware policies: the router the report assumes (`cachemodel`)."""
GIE_ASSUMED_BLOCKS = 31_250
"""The Gateway API inference extension's assumed LRU capacity per pod (blocks)."""


class PrefixScorer(Protocol):
    """What `exact-index` needs of an index (`kvscope.index.state.PrefixIndex` is one)."""

    def apply_all(self, envelopes: Iterable[Envelope]) -> None:
        """Apply decoded kv-events records, in order."""

    def score(self, block_hashes: Sequence[int], *, now: float | None = None) -> ScoreResult:
        """Every source's cached prefix of `block_hashes` at time `now`."""


@dataclass
class RoutingStats:
    """How a policy's view compared with the engines' truth at its decisions."""

    decisions: int = 0
    predicted_blocks: int = 0
    """Prefix blocks the policy expected on the engines it chose."""
    resident_blocks: int = 0
    """Prefix blocks those engines really held at the decision."""
    chose_best: int = 0
    """Decisions whose engine held the longest prefix of all engines."""

    def record(self, predicted: int, resident: Sequence[int], chosen: int) -> None:
        """One decision: the chosen engine's predicted and every engine's resident prefix."""
        self.decisions += 1
        self.predicted_blocks += predicted
        self.resident_blocks += resident[chosen]
        self.chose_best += resident[chosen] == max(resident)

    def summary(self) -> dict[str, Any]:
        """The truth file's `routing` entry (JSON-ready)."""
        out: dict[str, Any] = asdict(self)
        out["chose_best_share"] = self.chose_best / self.decisions if self.decisions else 0.0
        return out


def pick_best(engines: Sequence[SimEngine], scores: Sequence[int], balance: int) -> int:
    """Index into `engines` of the best score among the engines loaded at most `balance`
    above the least loaded; ties go to the least loaded, then to the first."""
    least = min(e.load for e in engines)
    return -max(
        (scores[k], -e.load, -k) for k, e in enumerate(engines) if e.load <= least + balance
    )[2]


def leading_blocks(held: Container[int], hashes: Sequence[int]) -> int:
    """How many leading `hashes` are in `held`."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


def resident_prefixes(engines: Sequence[SimEngine], hashes: Sequence[int]) -> list[int]:
    """Each engine's truly cached prefix of `hashes`, in blocks."""
    return [e.pool.longest_prefix(hashes, len(hashes)) for e in engines]


class Router:
    """A routing policy: `pick` chooses an engine of one role group; `published` sees every
    body the fleet publishes (for policies fed by the stream)."""

    name = "round-robin"

    def __init__(self) -> None:
        self.stats = RoutingStats()
        self._next: dict[str, int] = defaultdict(int)

    def pick(
        self, group: str, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int
    ) -> SimEngine:
        """The engine of `engines` (one role group) that serves the next request."""
        resident = resident_prefixes(engines, hashes)
        k, predicted = self.choose(group, engines, hashes, now_us)
        self.stats.record(predicted, resident, k)
        return engines[k]

    def choose(
        self, group: str, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int
    ) -> tuple[int, int]:
        """(index of the chosen engine, prefix blocks the policy expects there)."""
        k = self._next[group] % len(engines)
        self._next[group] += 1
        return k, 0

    def published(self, source: Source, epoch: int, body: AnyBody, ts_us: int) -> None:
        """One body the fleet published (most policies ignore them)."""


class RandomRouter(Router):
    """A uniformly random engine (seeded)."""

    name = "random"

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(f"route/{seed}")

    def choose(
        self, group: str, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int
    ) -> tuple[int, int]:
        """A random engine; it expects nothing."""
        return self._rng.randrange(len(engines)), 0


class ScoringRouter(Router):
    """A cache-aware policy: scores every engine, then `pick_best`."""

    def __init__(self, balance: int = BALANCE) -> None:
        super().__init__()
        self.balance = balance

    def choose(
        self, group: str, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int
    ) -> tuple[int, int]:
        """The best-scored engine and its score."""
        scores = self.scores(engines, hashes, now_us)
        k = pick_best(engines, scores, self.balance)
        return k, scores[k]

    def scores(self, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int) -> list[int]:
        """Each engine's expected cached prefix of `hashes`, in blocks."""
        raise NotImplementedError


class OracleRouter(ScoringRouter):
    """The engines' true pools: the longest resident prefix."""

    name = "oracle"

    def scores(self, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int) -> list[int]:
        """What the engines hold now."""
        return resident_prefixes(engines, hashes)


class ApproximateRouter(ScoringRouter):
    """Per router replica and engine, an LRU of the hashes it routed there, `capacity` long.

    Requests go to the replicas in turn (per role group), as behind a load balancer; each
    replica scores an engine by the leading hashes of the prompt in its LRU and adds the
    prompt's hashes to the chosen engine's LRU. It never learns of evictions, of what the
    engine generated, or of what the other replicas routed.
    """

    name = "approximate"

    def __init__(self, replicas: int, capacity: int, balance: int = BALANCE) -> None:
        super().__init__(balance)
        self.capacity = capacity
        self._guesses: list[dict[str, OrderedDict[int, None]]] = [
            defaultdict(OrderedDict) for _ in range(replicas)
        ]
        self._turn: dict[str, int] = defaultdict(int)

    def choose(
        self, group: str, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int
    ) -> tuple[int, int]:
        """The next replica's best guess; the prompt's hashes become the newest of the
        chosen engine's LRU there."""
        replica = self._guesses[self._turn[group] % len(self._guesses)]
        self._turn[group] += 1
        scores = [leading_blocks(replica[e.source.instance], hashes) for e in engines]
        k = pick_best(engines, scores, self.balance)
        lru = replica[engines[k].source.instance]
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)
        return k, scores[k]


class ExactIndexRouter(ScoringRouter):
    """kvscope's prefix index, fed with the kv-events records the fleet publishes.

    Each `KVEventBatch` becomes the envelope the publisher would send (seq contiguous per
    source); before a decision at time t the index applies every record stamped up to
    t - `lag_s`, so the lag between publishing and indexing can be swept.
    """

    name = "exact-index"

    def __init__(self, index: PrefixScorer, lag_s: float, balance: int = BALANCE) -> None:
        super().__init__(balance)
        self.index = index
        self.lag_us = round(lag_s * 1e6)
        self._pending: deque[tuple[int, Envelope]] = deque()
        self._seq: dict[str, int] = defaultdict(int)

    def published(self, source: Source, epoch: int, body: AnyBody, ts_us: int) -> None:
        """Queue a kv-events record for the index (other streams do not concern it)."""
        if not isinstance(body, KVEventBatch):
            return
        seq = self._seq[source.key]
        self._seq[source.key] = seq + 1
        envelope = Envelope(source=source, epoch=epoch, seq=seq, ts=ts_us / 1e6, body=body)
        self._pending.append((ts_us, envelope))

    def scores(self, engines: Sequence[SimEngine], hashes: Sequence[int], now_us: int) -> list[int]:
        """The index's matched blocks per engine, after it caught up to now minus the lag
        (no source is ever stale here: the simulator loses no record)."""
        pending, cutoff = self._pending, now_us - self.lag_us
        due = []
        while pending and pending[0][0] <= cutoff:
            due.append(pending.popleft()[1])
        self.index.apply_all(due)
        result = self.index.score(hashes, now=cutoff / 1e6)
        matched = {s.instance: s.matched_blocks for s in result.sources}
        return [matched.get(e.source.instance, 0) for e in engines]


def make_router(
    policy: str,
    *,
    seed: int,
    replicas: int = 1,
    assumed_capacity_blocks: int = GIE_ASSUMED_BLOCKS,
    index_lag_s: float = 0.0,
    index: PrefixScorer | None = None,
) -> Router:
    """The router of a `--routing` policy (an alias names its policy's router);
    `exact-index` asks `index` (default: a new in-process `PrefixIndex`)."""
    policy = ALIASES.get(policy, policy)
    if policy == "round-robin":
        return Router()
    if policy == "random":
        return RandomRouter(seed)
    if policy == "oracle":
        return OracleRouter()
    if policy == "approximate":
        return ApproximateRouter(replicas, assumed_capacity_blocks)
    if policy == "exact-index":
        return ExactIndexRouter(index or default_index(), index_lag_s)
    raise ValueError(f"unknown routing {policy!r}; known: {', '.join(ROUTING)}")


def default_index() -> PrefixScorer:
    """kvscope's in-process prefix index (`kvscope.index.state.PrefixIndex`)."""
    from kvscope.index.state import PrefixIndex

    index: PrefixScorer = PrefixIndex()
    return index

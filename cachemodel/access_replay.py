"""Replay an access stream through vLLM-like block pools of another size: the exact what-if.

The refault model of `capacity_what_if.sql` sees only misses; the access stream says, per
request and source, which block hashes the request looked up, how many hit, how many blocks
it held and when (arrival, prefix lookup, release). Replaying those accesses in time order
through `BlockPool` (the simulator's copy of vLLM's pool: blocks of running requests
pinned, a finished request's blocks freed tail first into an LRU free queue) with
`capacity + extra` blocks gives the hits the larger cache would have had, near capacity
cliffs included. docs/analytics.md has the errors measured against simulator re-runs.

Routing: with `fixed` every request stays on the source that served it (round-robin and
random routers do not look at caches, so a re-run routes the same way). With
`prefix-aware` requests are routed again at their arrival, like the simulator's router
(longest resident prefix among the sources whose load is within `balance` of the least
loaded), since a bigger cache changes what a cache-aware router sees. `detect_routing`
tells which one the observed assignment looks like. Two more re-route the requests the way
routers without a view of the caches do, to price exact routing on the same traffic:
`round-robin` (each role group in turn) and `approximate` (the guessers' way: the Gateway
API inference extension's prefix scorer, Dynamo's approximate mode: the router remembers
the prompt blocks it sent to each source in an LRU of that source's capacity and routes by
that memory; it never sees an eviction, a block another router replica placed, or a clear;
`router_replicas` of them share the requests in turn). A request routed to another source
than the one that served it is looked up when that source would have looked it up
(`retiming`: at its next step) and holds its blocks as long as it did.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvscope.cachemodel.blockpool import BlockPool
from kvscope.cachemodel.retiming import StepClock
from kvscope.cachemodel.scoring import best
from kvscope.schemas import BlockAccess, Source

ROUTINGS = ("fixed", "prefix-aware", "round-robin", "approximate")
PREFIX_AWARE_SHARE = 0.8
"""Routing looks prefix-aware when, among arrivals where the sources' resident prefixes
differed, at least this share went to a source with the longest one (round robin over N
sources lands there about 1/N of the time)."""
GUESSING_REPLICAS = 4
"""Router replicas of the `approximate` replay by default: requests spread over them in turn,
each guessing from its own decisions only (as several gateway replicas do)."""
ROUTER_BALANCE = 4
"""The prefix-aware router's load slack: it picks the longest resident prefix among the
sources with at most this many more requests in flight than the least loaded one (the load
balance it gives up for hits), like the simulator's router."""


RESERVED_BLOCKS = {"vllm": 1}
"""Blocks of an engine's reported capacity that never hold a request's KV, by engine: vLLM
counts its null block (block 0, a placeholder) in `num_gpu_blocks`. The replay gives a
source `capacity - reserved` blocks, as the engine's own pool has."""


@dataclass(slots=True)
class Access:
    """One request's use of one source's cache (one row of the access stream)."""

    source: str
    """`instance/dp_rank` of the source that served it."""
    role: str
    arrival_us: int
    """When the request reached the source (queue entry), µs."""
    lookup_us: int
    """When the scheduler looked its prefix up and allocated its blocks, µs."""
    free_us: int
    """When its blocks went back to the free queue (finish, or end of the KV transfer), µs."""
    prompt_tokens: int
    block_size: int
    hit_blocks: int
    """Leading prompt blocks found cached at lookup (as observed)."""
    held_blocks: int
    """Blocks it held when released (prompt, then generated, the last one maybe partial)."""
    hashes: list[int]
    """Hashes of its full blocks: the prompt's `prompt_tokens // block_size`, then generated."""
    held_until_free: bool = False
    """True when it left the scheduler at lookup (a prefill whose blocks wait for a transfer)."""
    engine: str = ""
    """The engine that published it (`vllm`, `simulator`, ...; "" when unknown)."""

    @property
    def prompt_blocks(self) -> int:
        """Blocks allocated at lookup (the prompt, the last one maybe partial)."""
        return math.ceil(self.prompt_tokens / self.block_size)

    @property
    def lookup_limit(self) -> int:
        """At most this many leading blocks can hit (vLLM recomputes the last prompt token)."""
        return max(0, (self.prompt_tokens - 1) // self.block_size)

    @property
    def group(self) -> str:
        """Routing group: decode instances are chosen among decoders, the rest among the rest."""
        return "decode" if self.role == "decode" else "first"


def from_body(source: Source, body: BlockAccess) -> Access:
    """The `Access` of one `BlockAccess` body published by `source`."""
    return Access(
        source=source.key,
        role=source.role,
        arrival_us=round(body.arrival_ts * 1e6),
        lookup_us=round(body.lookup_ts * 1e6),
        free_us=round(body.free_ts * 1e6),
        prompt_tokens=body.prompt_tokens,
        block_size=body.block_size,
        hit_blocks=body.hit_blocks,
        held_blocks=body.held_blocks,
        hashes=list(body.block_hashes),
        held_until_free=body.held_until_free,
        engine=source.engine,
    )


@dataclass
class SourceResult:
    """What one source looked up and hit in a replay (tokens)."""

    queries: int = 0
    hits: int = 0
    choices: int = 0
    """Arrivals routed here while the group's sources held prefixes of different lengths."""
    longest: int = 0
    """Of those, arrivals for which this source held the longest prefix."""
    requests: int = 0


@dataclass
class _Replica:
    """One source's pool in a replay, with the blocks of its live requests."""

    pool: BlockPool
    clock: StepClock
    load: int = 0
    live: dict[int, list[int]] = field(default_factory=dict)


def natural_key(source: str) -> tuple[int | str, ...]:
    """Sort key that puts engine-2 before engine-10 (the order routers list instances in)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", source))


def replay(
    accesses: Sequence[Access],
    capacities: Mapping[str, int],
    routing: str = "fixed",
    clears: Iterable[tuple[str, int]] = (),
    balance: int = ROUTER_BALANCE,
    router_replicas: int = GUESSING_REPLICAS,
    affinity: float | None = None,
    count_from_us: int = 0,
) -> dict[str, SourceResult]:
    """Replay `accesses` through pools of `capacities[source]` blocks; per-source results.

    `count_from_us`: accesses arriving before it fill the pools (the state a later part of a
    window starts from) but are not counted in the results.

    `clears` are (source, µs) of AllBlocksCleared. Sources without a capacity are skipped.
    `router_replicas`: how many guessing routers share the requests (`approximate` only).
    `affinity`: re-route (`prefix-aware`, `approximate`) by `kvscope route`'s scorer with
    this weight of cache affinity against load, ties taking turns; None: by the simulator's
    router (longest prefix within `balance`, ties to the first).
    """
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}")
    order = sorted(capacities, key=natural_key)
    replicas = {}
    for s in order:
        mine = [a for a in accesses if a.source == s]
        size = min((a.block_size for a in mine), default=16)
        reserved = max((RESERVED_BLOCKS.get(a.engine, 0) for a in mine), default=0)
        times = (t for a in mine for t in (a.lookup_us, a.free_us))
        replicas[s] = _Replica(
            BlockPool(max(1, capacities[s] - reserved), size),
            StepClock(times, (a.arrival_us for a in mine)),
        )
    groups: dict[str, list[str]] = {}
    for a in accesses:
        if a.source in replicas and a.source not in groups.setdefault(a.group, []):
            groups[a.group].append(a.source)
    for members in groups.values():
        members.sort(key=natural_key)
    results = {s: SourceResult() for s in order}
    uncounted = SourceResult()

    def out(k: int, source: str) -> SourceResult:
        return results[source] if accesses[k].arrival_us >= count_from_us else uncounted

    heap: list[tuple[int, int, int, int, object]] = []
    tie = itertools.count()
    for s, at in clears:
        if s in replicas:
            heapq.heappush(heap, (at, 0, next(tie), -1, s))
    for k, a in enumerate(accesses):
        if a.source in replicas:
            heapq.heappush(heap, (a.arrival_us, 1, next(tie), k, a))
    where: dict[int, str] = {}
    turns: dict[str, int] = {}
    guessers = [{s: _Guess(capacities[s]) for s in order} for _ in range(max(1, router_replicas))]
    rule = _Rule(balance, affinity)
    while heap:
        at, kind, _, k, item = heapq.heappop(heap)
        if kind == 0:
            _clear(replicas[item].pool)  # type: ignore[index]
            continue
        a = accesses[k]
        if kind == 1:
            guesses = guessers[k % len(guessers)]
            s = _pick(a, routing, groups[a.group], replicas, rule, turns, guesses)
            _score(a, s, groups[a.group], replicas, out(k, s))
            where[k] = s
            replicas[s].load += 1
            lookup = replicas[s].clock.lookup(
                a.arrival_us, a.lookup_us - a.arrival_us, s != a.source
            )
            heapq.heappush(heap, (lookup, 3, next(tie), k, None))
        elif kind == 3:
            r = replicas[where[k]]
            _lookup(r, k, a, out(k, where[k]))
            if a.held_until_free:
                r.load -= 1
            heapq.heappush(heap, (at + a.free_us - a.lookup_us, 2, next(tie), k, None))
        else:
            r = replicas[where[k]]
            _release(r, k, a)
            if not a.held_until_free:
                r.load -= 1
            out(k, where.pop(k)).requests += 1
    return results


class _Guess:
    """What a guessing router believes one source holds: the prompt blocks it sent there,
    least recently sent first out beyond `capacity` blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.blocks: dict[int, None] = {}

    def prefix(self, hashes: Sequence[int]) -> int:
        """Leading blocks of `hashes` it believes the source holds."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def sent(self, hashes: Sequence[int]) -> None:
        """The router sent a request with these prompt blocks to the source."""
        for h in hashes:
            self.blocks.pop(h, None)
            self.blocks[h] = None
        while len(self.blocks) > self.capacity:
            del self.blocks[next(iter(self.blocks))]


def _pick(
    a: Access,
    routing: str,
    members: list[str],
    replicas: dict[str, _Replica],
    rule: _Rule,
    turns: dict[str, int],
    guesses: dict[str, _Guess],
) -> str:
    """The source `routing` sends `a` to."""
    if routing == "fixed":
        return a.source
    if routing == "prefix-aware":
        n = len(a.hashes)
        return rule(a, members, replicas, lambda s: replicas[s].pool.longest_prefix(a.hashes, n))
    if routing == "round-robin":
        turn = turns.get(a.group, 0)
        turns[a.group] = turn + 1
        return members[turn % len(members)]
    prompt = a.hashes[: a.prompt_tokens // a.block_size]
    chosen = rule(a, members, replicas, lambda s: guesses[s].prefix(prompt))
    guesses[chosen].sent(prompt)
    return chosen


class _Rule:
    """How a cache-aware router picks among `members` by their prefixes (in blocks) of a
    request and their loads: the simulator's router (`affinity` None) or `kvscope route`'s
    scorer (`kvscope.cachemodel.scoring.best`, with its turn for ties)."""

    def __init__(self, balance: int, affinity: float | None) -> None:
        self.balance = balance
        self.affinity = affinity
        self.turn = 0

    def __call__(
        self,
        a: Access,
        members: list[str],
        replicas: dict[str, _Replica],
        prefix: Callable[[str], int],
    ) -> str:
        if self.affinity is None:
            return _best(members, replicas, self.balance, prefix)
        self.turn += 1
        matched = [prefix(s) * a.block_size for s in members]
        loads = [replicas[s].load for s in members]
        return members[best(matched, loads, a.prompt_tokens, self.affinity, self.turn)]


def _best(
    members: list[str],
    replicas: dict[str, _Replica],
    balance: int,
    prefix: Callable[[str], int],
) -> str:
    """The member with the longest `prefix` among those loaded at most `balance` above the
    least loaded; ties go to the less loaded, then to the first (the simulator's router)."""
    least = min(replicas[s].load for s in members)
    top = max(
        (prefix(s), -replicas[s].load, -i)
        for i, s in enumerate(members)
        if replicas[s].load <= least + balance
    )
    return members[-top[2]]


def _score(
    a: Access, chosen: str, members: list[str], replicas: dict[str, _Replica], out: SourceResult
) -> None:
    """Count whether `chosen` held the longest resident prefix, when the sources differed."""
    n = a.prompt_tokens // a.block_size
    prefixes = {s: replicas[s].pool.longest_prefix(a.hashes, n) for s in members}
    if len(set(prefixes.values())) > 1:
        out.choices += 1
        out.longest += prefixes[chosen] == max(prefixes.values())


def _lookup(r: _Replica, k: int, a: Access, out: SourceResult) -> None:
    """Prefix lookup and allocation of the prompt's blocks, as the scheduler does at admission."""
    pool = r.pool
    n_prompt = min(a.prompt_tokens // a.block_size, len(a.hashes))
    prompt = a.hashes[:n_prompt]
    hit = pool.longest_prefix(prompt, a.lookup_limit)
    reused = {i: pool.cached[h] for i, h in enumerate(prompt) if h in pool.cached}
    pool.touch(reused.values())
    new = iter(pool.allocate(min(a.prompt_blocks - len(reused), pool.num_free)))
    picked = (reused[i] if i in reused else next(new, None) for i in range(a.prompt_blocks))
    blocks = [b for b in picked if b is not None]
    if len(blocks) >= n_prompt:
        pool.commit(blocks, prompt, hit, n_prompt)
    pool.take_events()
    r.live[k] = blocks
    out.queries += a.prompt_tokens
    out.hits += hit * a.block_size


def _release(r: _Replica, k: int, a: Access) -> None:
    """Allocate and cache the generated blocks, then free everything tail first."""
    pool = r.pool
    blocks = r.live.pop(k)
    missing = a.held_blocks - len(blocks)
    if missing > 0:
        blocks += pool.allocate(min(missing, pool.num_free))
    n_prompt = min(a.prompt_tokens // a.block_size, len(a.hashes))
    n_full = min(len(a.hashes), len(blocks))
    if n_full > n_prompt:
        pool.commit(blocks, a.hashes, n_prompt, n_full)
    pool.free(reversed(blocks))
    pool.take_events()


def _clear(pool: BlockPool) -> None:
    """Drop every cached hash (a clear in the data); blocks in use keep their references."""
    if pool.reset():
        pool.take_events()
        return
    for b, h in enumerate(pool.block_hash):
        if h is not None:
            del pool.cached[h]
            pool.block_hash[b] = None


def settle_clears(
    accesses: Sequence[Access], clears: Iterable[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Clears (source, µs) moved back to when the engine performed them.

    A stored AllBlocksCleared carries the time of the KV-event batch that held it, which an
    engine (vLLM) publishes at the end of the next step, after that step's admissions. An
    engine clears its prefix cache only while no request holds blocks, so a clear stamped
    while requests were live happened before the lookup that ended the last idle moment:
    it is moved to 1 µs before that lookup. A clear stamped while the source was idle
    stays where it is.
    """
    marks: dict[str, list[tuple[int, int]]] = {}
    for a in accesses:
        source_marks = marks.setdefault(a.source, [])
        source_marks.append((a.lookup_us, 1))
        source_marks.append((a.free_us, -1))
    for source_marks in marks.values():
        source_marks.sort()
    settled = []
    for source, at in clears:
        live, busy_since = 0, at
        for when, change in marks.get(source, ()):
            if when > at:
                break
            if change == 1 and live == 0:
                busy_since = when
            live += change
        settled.append((source, at if live <= 0 else min(at, busy_since - 1)))
    return settled


def detect_routing(accesses: Sequence[Access], capacities: Mapping[str, int]) -> str:
    """`prefix-aware` if, replayed as observed, requests went to the source with the longest
    resident prefix (when the prefixes differed) at least `PREFIX_AWARE_SHARE` of the time;
    else `fixed`. One-source groups, or prefixes that never differed, say `fixed`."""
    if not accesses:
        return "fixed"
    res = replay(accesses, capacities, "fixed").values()
    choices = sum(r.choices for r in res)
    longest = sum(r.longest for r in res)
    return "prefix-aware" if choices and longest / choices >= PREFIX_AWARE_SHARE else "fixed"

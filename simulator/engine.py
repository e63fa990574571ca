"""One simulated engine instance: a scheduler stepping requests through a `BlockPool`.

Each step (on a fixed grid of simulated time) the engine frees the blocks of finished
transfers, performs a pending reset when idle, advances running requests by a chunk of
decode tokens, admits waiting requests in FIFO order while blocks allow (prefix lookup,
allocation, caching of full blocks), and publishes that step's KV events as one
`KVEventBatch`, like vLLM does after each engine step (several, in order, when they exceed the
rows the collector takes per record). Admission reserves the blocks a
request will need until it finishes, so the simulator never preempts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvscope.cachemodel.blockpool import BlockPool, PoolEvent, chain_hashes
from kvscope.schemas import (
    AllBlocksCleared,
    AnyBody,
    BlockAccess,
    BlockRemoved,
    BlockStored,
    EngineStats,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
)
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD
from kvscope.simulator.workloads import SimRequest

Emit = Callable[[Source, AnyBody, int], None]
"""emit(source, body, ts_us): hand one body of one source to the publisher."""


@dataclass(slots=True)
class Work:
    """A request waiting at an engine: `kind` is full (prefill+decode), prefill or decode."""

    request: SimRequest
    hashes: list[int]
    kind: str
    arrived_us: int
    transfer: KVTransfer | None = None
    """For decode work in P/D: the transfer that brought its KV (published on admission)."""


@dataclass(slots=True)
class Running:
    """A request admitted to an engine: its blocks, hashes and decode progress."""

    work: Work
    tokens: list[int]
    block_ids: list[int]
    hashes: list[int]
    committed: int
    reserved: int
    hit_tokens: int
    generated: int = 0
    scheduled_us: int = 0


@dataclass(slots=True)
class EngineCounters:
    """Prefix-cache token counters since the last `EngineStats` snapshot."""

    queries: int = 0
    hits: int = 0
    last_stats_us: int = 0


class SimEngine:
    """A simulated vLLM engine (one instance, dp_rank 0) with one KV block pool."""

    def __init__(
        self,
        source: Source,
        capacity_blocks: int,
        block_size: int,
        decode_tokens_per_step: int,
        max_running: int,
        emit: Emit,
        on_kv: Callable[[str, int, list[PoolEvent]], None],
        on_prefix: Callable[[str, int, int], None],
        on_prefilled: Callable[[SimEngine, Running, int], int],
        on_finished: Callable[[SimEngine, Running, int], None],
        access_stream: bool = False,
        prefill_tokens_per_s: float = 8000.0,
    ) -> None:
        self.source = source
        self.prefill_tokens_per_s = prefill_tokens_per_s
        """Reported prefill throughput (`SimConfig.prefill_tokens_per_s`)."""
        self.pool = BlockPool(capacity_blocks, block_size)
        self.block_size = block_size
        self.decode_chunk = decode_tokens_per_step
        self.max_running = max_running
        self.waiting: deque[Work] = deque()
        self.running: list[Running] = []
        self.held: list[tuple[int, Running]] = []
        """(free time µs, request) of prefill results kept until their transfer ends."""
        self.access_stream = access_stream
        """Publish a `BlockAccess` per request when it releases its blocks."""
        self.reserved = 0
        self.reset_pending = False
        self.counters = EngineCounters()
        self._emit = emit
        self._on_kv = on_kv
        self._on_prefix = on_prefix
        self._on_prefilled = on_prefilled
        self._on_finished = on_finished

    @property
    def load(self) -> int:
        """Requests queued or running (the router's tie-breaker)."""
        return len(self.waiting) + len(self.running)

    def step(self, now_us: int, stats_interval_us: int) -> None:
        """Run one engine step at simulated time `now_us` and publish its bodies."""
        self._release_held(now_us)
        if self.reset_pending and not self.running and not self.held:
            self.reset_pending = not self.pool.reset()
        self._decode(now_us)
        if not self.reset_pending:
            self._admit(now_us)
        events = self.pool.take_events()
        if events:
            self._on_kv(self.source.key, now_us, events)
        for record in _records(events):
            batch = KVEventBatch(
                ts=now_us / 1e6, events=[_to_wire(e, self.block_size) for e in record], dp_rank=0
            )
            self._emit(self.source, batch, now_us)
        if now_us - self.counters.last_stats_us >= stats_interval_us:
            self.publish_stats(now_us)

    def publish_stats(self, now_us: int) -> None:
        """Publish an `EngineStats` snapshot with the prefix counters since the last one."""
        c = self.counters
        body = EngineStats(
            capacity_blocks=self.pool.num_blocks,
            block_size=self.block_size,
            usage=round(self.pool.usage, 6),
            running=len(self.running),
            waiting=len(self.waiting),
            prefix_queries_delta=c.queries,
            prefix_hits_delta=c.hits,
            interval_s=(now_us - c.last_stats_us) / 1e6,
        )
        self._emit(self.source, body, now_us)
        c.queries = c.hits = 0
        c.last_stats_us = now_us

    def next_release_us(self) -> int | None:
        """When the earliest held prefill result may be freed (None if none is held)."""
        return min((t for t, _ in self.held), default=None)

    def _release_held(self, now_us: int) -> None:
        keep = []
        for t, run in self.held:
            if t <= now_us:
                self.pool.free(reversed(run.block_ids))
                self._publish_access(run, now_us)
            else:
                keep.append((t, run))
        self.held = keep

    def _decode(self, now_us: int) -> None:
        bs = self.block_size
        still = []
        for r in self.running:
            out = r.work.request.output
            k = min(self.decode_chunk, len(out) - r.generated)
            r.tokens.extend(out[r.generated : r.generated + k])
            r.generated += k
            need = math.ceil(len(r.tokens) / bs) - len(r.block_ids)
            if need > 0:
                r.block_ids.extend(self.pool.allocate(need))
                r.reserved -= need
                self.reserved -= need
            full = len(r.tokens) // bs
            if full > len(r.hashes):
                r.hashes = chain_hashes(r.tokens, bs, len(r.hashes), r.hashes)
            self.pool.commit(r.block_ids, r.hashes, r.committed, full)
            r.committed = full
            if r.generated >= len(out):
                self._finish(r, now_us, len(out))
            else:
                still.append(r)
        self.running = still

    def _finish(self, r: Running, now_us: int, output_tokens: int) -> None:
        self.pool.free(reversed(r.block_ids))
        self.reserved -= r.reserved
        self._publish_access(r, now_us)
        self._publish_request(r, now_us, output_tokens)
        self._on_finished(self, r, now_us)

    def _publish_request(self, r: Running, now_us: int, output_tokens: int) -> None:
        w = r.work
        step_s = (now_us - r.scheduled_us) / 1e6
        queue_s = (r.scheduled_us - w.arrived_us) / 1e6
        uncached = len(w.request.prompt) - r.hit_tokens
        prefill_s = 0.0 if self.source.role == "decode" else uncached / self.prefill_tokens_per_s
        body = RequestFinished(
            request_id=w.request.request_id,
            prompt_tokens=len(w.request.prompt),
            cached_tokens=r.hit_tokens,
            output_tokens=output_tokens,
            ttft_s=queue_s + prefill_s,
            queue_s=queue_s,
            prefill_s=prefill_s,
            decode_s=step_s,
            e2e_s=(now_us - w.arrived_us) / 1e6,
            finish_reason="length",
        )
        self._emit(self.source, body, now_us)

    def _publish_access(self, r: Running, now_us: int) -> None:
        """The request's `BlockAccess`, if the access stream is on (at release, `now_us`)."""
        if not self.access_stream:
            return
        w = r.work
        body = BlockAccess(
            request_id=w.request.request_id,
            prompt_tokens=len(w.request.prompt),
            block_size=self.block_size,
            block_hashes=list(r.hashes),
            hit_blocks=r.hit_tokens // self.block_size,
            held_blocks=len(r.block_ids),
            arrival_ts=w.arrived_us / 1e6,
            lookup_ts=r.scheduled_us / 1e6,
            free_ts=now_us / 1e6,
            held_until_free=w.kind == "prefill",
            session=w.request.session,
        )
        self._emit(self.source, body, now_us)

    def _admit(self, now_us: int) -> None:
        while self.waiting and len(self.running) < self.max_running:
            if not self._try_admit(self.waiting[0], now_us):
                return
            self.waiting.popleft()

    def _try_admit(self, w: Work, now_us: int) -> bool:
        pool, bs = self.pool, self.block_size
        prompt = w.request.prompt
        n_full = len(w.hashes)
        hit = pool.longest_prefix(w.hashes, (len(prompt) - 1) // bs)
        reused = {i: pool.cached[h] for i, h in enumerate(w.hashes) if h in pool.cached}
        prompt_blocks = math.ceil(len(prompt) / bs)
        final_blocks = math.ceil(
            (len(prompt) + (0 if w.kind == "prefill" else len(w.request.output))) / bs
        )
        if final_blocks > pool.num_blocks:
            raise ValueError(
                f"{w.request.request_id} needs {final_blocks} blocks, more than the "
                f"{pool.num_blocks} of {self.source.instance}: raise --capacity-blocks"
            )
        future = final_blocks - prompt_blocks
        touched = list(reused.values())
        touched_free = sum(1 for b in touched if pool.ref_cnt[b] == 0)
        need_now = prompt_blocks - len(touched)
        if pool.num_free - touched_free - self.reserved < need_now + future:
            return False
        pool.touch(touched)
        new = iter(pool.allocate(need_now))
        blocks = [reused[i] if i in reused else next(new) for i in range(prompt_blocks)]
        pool.commit(blocks, w.hashes, hit, n_full)
        self.counters.queries += len(prompt)
        self.counters.hits += hit * bs
        self._on_prefix(self.source.key, len(prompt), hit * bs)
        run = Running(w, list(prompt), blocks, list(w.hashes), n_full, future, hit * bs)
        run.scheduled_us = now_us
        self.reserved += future
        if w.transfer is not None:
            self._emit(self.source, w.transfer, now_us)
        if w.kind == "prefill":
            self._publish_request(run, now_us, 1)
            self.held.append((self._on_prefilled(self, run, now_us), run))
        else:
            self.running.append(run)
        return True


def _records(events: list[PoolEvent]) -> Iterator[list[PoolEvent]]:
    """A step's events in order, cut into records of at most the collector's
    `MAX_ROWS_PER_RECORD` rows (one per hash, one per clear); no record when there are none."""
    record: list[PoolEvent] = []
    rows = 0
    for e in events:
        n = len(e.hashes) or 1
        if record and rows + n > MAX_ROWS_PER_RECORD:
            yield record
            record, rows = [], 0
        record.append(e)
        rows += n
    if record:
        yield record


def _to_wire(e: PoolEvent, block_size: int) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """The schema event for one pool event (the shape vLLM publishes)."""
    if e.kind == "stored":
        return BlockStored(
            block_hashes=e.hashes,
            parent_block_hash=e.parent,
            block_size=block_size,
            token_count=len(e.hashes) * block_size,
        )
    if e.kind == "removed":
        return BlockRemoved(block_hashes=e.hashes)
    return AllBlocksCleared()

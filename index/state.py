"""`PrefixIndex`: the exact KV state of every source, from kvscope's kv-events stream.

A source is one engine instance and data-parallel rank. The index keeps, per source, the
epoch it believes current, the last applied seq, and per tier (medium, plus the offloading
tier an engine names) the resident block hashes with their copy counts (`table.BlockTable`).
The rules (docs/index.md):

- BlockStored adds one copy of each hash; BlockRemoved drops one (vLLM can hold two copies
  of a hash: removing one keeps the other); AllBlocksCleared empties the source.
- A record of a new epoch replaces the source's old state (an engine restart empties its
  cache); late records of a replaced epoch are ignored.
- A seq at or below the last applied one is a publisher retry's duplicate and is skipped.
- A `Gap`, a hole in seq, or an epoch first seen past seq 0 marks the source *stale*: its
  state may miss events. A clear or a new epoch starting at seq 0 re-establishes it; so
  does a restart of the index that reads exact stored state. Answers flag stale sources.
- Routed hints (`add_routed`) are short-lived speculative entries a router posts when it
  sends a request somewhere, to bridge the publish-to-index lag; a confirmed BlockStored
  replaces them. They extend scores (counted apart as `speculative_blocks`) and never show
  as resident.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from kvscope.index.config import DEFAULT_TIER_WEIGHTS
from kvscope.index.protocol import ScoreResult, SourceScore
from kvscope.index.table import REMOVE, STORE, BlockTable
from kvscope.schemas import Envelope
from kvscope.schemas.wire import AllBlocksCleared, BlockRemoved, BlockStored, Gap, KVEventBatch

MAX_HINTS_PER_SOURCE = 200_000
"""Routed hints kept per source; expired ones go first when a source has more."""
RETIRED_EPOCHS_KEPT = 64
"""Replaced epochs remembered per source, to ignore their late records."""

_SCORE = operator.attrgetter("score")
SourceKey = tuple[str, int]
"""(instance, dp_rank)."""


@dataclasses.dataclass
class SourceState:
    """What the index knows about one source."""

    instance: str
    dp_rank: int
    number: int
    """The source's index in score arrays (fixed for the index's life)."""
    epoch: int | None = None
    last_seq: int = -1
    stale: bool = False
    stale_reason: str = ""
    model: str = ""
    block_size: int = 0
    last_ts: float = 0.0
    """Engine timestamp of the newest record applied for this source."""
    slots: dict[str, int] = dataclasses.field(default_factory=dict)
    """Tier name (medium, or medium/tier) -> slot in the block table."""
    retired: list[int] = dataclasses.field(default_factory=list)
    hints: dict[int, float] = dataclasses.field(default_factory=dict)
    """Routed hints: hash -> expiry (monotonic seconds)."""

    def mark_stale(self, reason: str) -> None:
        """The source's state may miss events from here on."""
        if not self.stale:
            self.stale, self.stale_reason = True, reason


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """One row of `GET /sources`."""

    instance: str
    dp_rank: int
    epoch: int
    resident: int
    stale: bool
    lag_s: float
    model: str
    block_size: int
    stale_reason: str
    tiers: dict[str, int]


class PrefixIndex:
    """Exact per-source resident blocks, applied from decoded kv-events envelopes."""

    def __init__(
        self,
        tier_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.tier_weights = dict(tier_weights or DEFAULT_TIER_WEIGHTS)
        self.table = BlockTable()
        self._sources: dict[SourceKey, SourceState] = {}
        self._by_number: list[SourceState] = []
        self._slot_source = np.zeros(0, dtype=np.int64)
        self._slot_weight = np.zeros(0, dtype=np.float64)
        self._hashes: list[int] = []
        self._runs: list[tuple[int, int, int]] = []
        """Pending ops as runs: (hashes in the run, slot, kind)."""
        self.newest_ts = 0.0
        """Engine timestamp of the newest record applied (0 before any)."""
        self.applied_events = 0
        """Block events (one per hash) and clears applied so far."""
        self.records = 0
        """Records applied (duplicates and replaced epochs' records not counted)."""

    # ---- applying ------------------------------------------------------------------

    def apply(self, envelope: Envelope) -> None:
        """Apply one kv-events record (other bodies are ignored)."""
        self.apply_all((envelope,))

    def apply_all(self, envelopes: Iterable[Envelope]) -> None:
        """Apply records in order; their block ops go to the table as one batch."""
        for envelope in envelopes:
            body = envelope.body
            if not isinstance(body, KVEventBatch | Gap):
                continue
            source = self._admit(envelope)
            if source is None:
                continue
            self.records += 1
            if isinstance(body, Gap):
                source.mark_stale(f"publisher lost seqs {body.first_seq}..{body.last_seq}")
                continue
            for event in body.events:
                self._event(source, event)
        self._flush()

    def _admit(self, envelope: Envelope) -> SourceState | None:
        """The record's source if the record is to be applied (epoch and seq rules)."""
        who = envelope.source
        source = self._source(who.instance, who.dp_rank)
        if envelope.epoch != source.epoch:
            if envelope.epoch in source.retired:
                return None
            self._new_epoch(source, envelope.epoch)
            if envelope.seq != 0:
                source.mark_stale(f"epoch first seen at seq {envelope.seq}")
        elif envelope.seq <= source.last_seq:
            return None
        elif envelope.seq > source.last_seq + 1:
            source.mark_stale(f"seqs {source.last_seq + 1}..{envelope.seq - 1} missing")
        source.last_seq = envelope.seq
        if who.model:
            source.model = who.model
        if envelope.ts > source.last_ts:
            source.last_ts = envelope.ts
            self.newest_ts = max(self.newest_ts, envelope.ts)
        return source

    def _new_epoch(self, source: SourceState, epoch: int) -> None:
        if source.epoch is not None:
            source.retired = [*source.retired, source.epoch][-RETIRED_EPOCHS_KEPT:]
            self._clear(source)
        source.epoch = epoch
        source.last_seq = -1
        source.stale, source.stale_reason = False, ""

    def _event(self, source: SourceState, event: object) -> None:
        if isinstance(event, BlockStored):
            tier = event.medium if event.tier is None else f"{event.medium}/{event.tier}"
            self._ops(self._slot(source, tier), event.block_hashes, STORE)
            if event.block_size:
                source.block_size = event.block_size
            if source.hints:
                for block_hash in event.block_hashes:
                    source.hints.pop(block_hash, None)
        elif isinstance(event, BlockRemoved):
            tier = event.medium if event.tier is None else f"{event.medium}/{event.tier}"
            self._ops(self._slot(source, tier), event.block_hashes, REMOVE)
        elif isinstance(event, AllBlocksCleared):
            self._clear(source)
            source.stale, source.stale_reason = False, ""
            self.applied_events += 1

    def _ops(self, slot: int, hashes: Sequence[int], kind: int) -> None:
        self._hashes.extend(hashes)
        self._runs.append((len(hashes), slot, kind))

    def _flush(self) -> None:
        if not self._hashes:
            return
        runs = np.array(self._runs, dtype=np.int64).reshape(-1, 3)
        ops = (
            np.array(self._hashes, dtype=np.uint64),
            np.repeat(runs[:, 1].astype(np.int32), runs[:, 0]),
            np.repeat(runs[:, 2].astype(np.int8), runs[:, 0]),
        )
        self.applied_events += len(self._hashes)
        self._hashes, self._runs = [], []
        self.table.apply(ops)

    def _clear(self, source: SourceState) -> None:
        self._flush()
        for slot in source.slots.values():
            self.table.drop_slot(slot)
        source.hints.clear()

    def _source(self, instance: str, dp_rank: int) -> SourceState:
        key = (instance, dp_rank)
        source = self._sources.get(key)
        if source is None:
            source = SourceState(instance, dp_rank, number=len(self._by_number))
            self._sources[key] = source
            self._by_number.append(source)
        return source

    def _slot(self, source: SourceState, tier: str) -> int:
        slot = source.slots.get(tier)
        if slot is None:
            slot = len(self._slot_source)
            self.table.ensure_slot(slot)
            source.slots[tier] = slot
            weight = self.tier_weights.get(tier.split("/", 1)[0], 0.5)
            self._slot_source = np.append(self._slot_source, source.number)
            self._slot_weight = np.append(self._slot_weight, weight)
        return slot

    # ---- stored state (cold start) -------------------------------------------------------

    def restore_source(
        self,
        instance: str,
        dp_rank: int,
        *,
        epoch: int,
        last_seq: int,
        stale_reason: str,
        model: str,
        block_size: int,
        last_ts: float,
        retired: Sequence[int] = (),
    ) -> None:
        """Set one source as stored state says it was (before its blocks are loaded)."""
        source = self._source(instance, dp_rank)
        self._new_epoch(source, epoch)
        source.retired = [e for e in retired if e != epoch][-RETIRED_EPOCHS_KEPT:]
        source.last_seq = last_seq
        if stale_reason:
            source.mark_stale(stale_reason)
        source.model, source.block_size, source.last_ts = model, block_size, last_ts
        self.newest_ts = max(self.newest_ts, last_ts)

    def slot_for(self, instance: str, dp_rank: int, tier: str) -> int:
        """The table slot of one source's tier (made on first use): for bulk loads."""
        return self._slot(self._source(instance, dp_rank), tier)

    # ---- answers -------------------------------------------------------------------------

    def lag_s(self, now: float | None = None) -> float:
        """Seconds from the newest applied record's engine timestamp to `now` (0 if none)."""
        if not self.newest_ts:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - self.newest_ts)

    def score(
        self,
        block_hashes: Sequence[int],
        *,
        model: str | None = None,
        now: float | None = None,
    ) -> ScoreResult:
        """Per source (of `model`, when given): the request's leading blocks it holds."""
        self._flush()
        hashes = np.array(block_hashes, dtype=np.uint64)
        n_sources = len(self._by_number)
        matched, weights = self.table.score(hashes, self._slot_source, self._slot_weight, n_sources)
        mono = time.monotonic()
        hint_weight = self.tier_weights.get("GPU", 1.0)
        answers = []
        for source, confirmed, weight in zip(
            self._by_number, matched.tolist(), weights.tolist(), strict=True
        ):
            if source.epoch is None or (model and source.model and source.model != model):
                continue
            extra = _hinted_run(source.hints, block_hashes, confirmed, mono) if source.hints else 0
            blocks = confirmed + extra
            answers.append(
                SourceScore(
                    source.instance,
                    source.dp_rank,
                    blocks,
                    blocks * source.block_size,
                    weight + extra * hint_weight,
                    source.stale,
                    extra,
                    source.model,
                )
            )
        answers.sort(key=_SCORE, reverse=True)  # stable: ties keep the sources' order
        return ScoreResult(lag_s=self.lag_s(now), sources=answers)

    def add_routed(
        self,
        block_hashes: Sequence[int],
        instance: str,
        dp_rank: int = 0,
        *,
        ttl_s: float = 2.0,
    ) -> bool:
        """Hint that a request with these blocks was sent to the source; False if unknown."""
        source = self._sources.get((instance, dp_rank))
        if source is None:
            return False
        now = time.monotonic()
        hints = source.hints
        if len(hints) + len(block_hashes) > MAX_HINTS_PER_SOURCE:
            for block_hash in [h for h, expiry in hints.items() if expiry <= now]:
                del hints[block_hash]
            while hints and len(hints) + len(block_hashes) > MAX_HINTS_PER_SOURCE:
                del hints[next(iter(hints))]
        expiry = now + ttl_s
        for block_hash in block_hashes:
            hints.pop(block_hash, None)
            hints[block_hash] = expiry
        return True

    def block_size(self, model: str) -> int:
        """The block size most of `model`'s sources published (0 when none has yet): how
        its engines split token ids into blocks."""
        sizes = [s.block_size for s in self._by_number if s.model == model and s.block_size]
        return max(set(sizes), key=sizes.count) if sizes else 0

    def source(self, instance: str, dp_rank: int) -> SourceState | None:
        """The state of one source, or None when the index has never seen it."""
        return self._sources.get((instance, dp_rank))

    def sources(self, now: float | None = None) -> list[SourceInfo]:
        """Every source with its epoch, resident blocks, staleness and lag."""
        self._flush()
        wall = time.time() if now is None else now
        rows = []
        for source in self._by_number:
            if source.epoch is None:
                continue
            tiers = {tier: self.table.resident(slot) for tier, slot in source.slots.items()}
            rows.append(
                SourceInfo(
                    instance=source.instance,
                    dp_rank=source.dp_rank,
                    epoch=source.epoch,
                    resident=sum(tiers.values()),
                    stale=source.stale,
                    lag_s=max(0.0, wall - source.last_ts) if source.last_ts else 0.0,
                    model=source.model,
                    block_size=source.block_size,
                    stale_reason=source.stale_reason,
                    tiers=tiers,
                )
            )
        return rows

    def resident(
        self, instance: str, dp_rank: int, *, start: int = 0, limit: int = 1000
    ) -> tuple[list[int], int | None]:
        """One page of a source's resident hashes (any tier) from table position `start`,
        and the position of the next page (None at the end)."""
        self._flush()
        source = self._sources.get((instance, dp_rank))
        if source is None or not source.slots:
            return [], None
        hashes, end = self.table.list_hashes(list(source.slots.values()), start, limit)
        return hashes, (end if end < self.table.size else None)


def _hinted_run(hints: dict[int, float], hashes: Sequence[int], start: int, now: float) -> int:
    """How many blocks from `start` on are routed hints that have not expired."""
    run = 0
    for block_hash in hashes[start:]:
        if hints.get(block_hash, 0.0) <= now:
            break
        run += 1
    return run

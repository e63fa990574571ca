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
  as resident. At most `MAX_HINTS_PER_REQUEST` leading blocks of a post and
  `MAX_HINTS_PER_SOURCE` per source are kept; the TTL is one constant, so insertion order
  is expiry order and expired or surplus hints leave from the front in O(1) each.
- `forget` drops sources (an operator's DELETE, or idle expiry); the remaining sources
  and their table slots are numbered densely again (in their old order), so memory and
  score time follow the live sources, not every source ever seen nor where their numbers
  fell among the forgotten ones. Forgetting, a clear and a new epoch cost the table's
  interned slot sets, not its buckets: answers are exact at once, and the buckets they
  emptied are deleted by `sweep` in bounded steps (a step after every applied batch, and
  the service's sweeper while the feed is quiet), so none of them holds the event loop
  for a pass over a table of millions of entries.
- `score` costs the sources that hold the request's first block (and those with hints):
  the table kernel lists only them, and the answers of all others (0 blocks) are kept
  between requests, renewed when a source comes, goes, turns stale or changes model.
"""

from __future__ import annotations

import array
import dataclasses
import operator
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import msgspec
import numpy as np
import numpy.typing as npt
from kvscope.index.config import DEFAULT_TIER_WEIGHTS
from kvscope.index.protocol import ScoreResult, SourceScore
from kvscope.index.table import REMOVE, STORE, BlockTable
from kvscope.schemas import Envelope
from kvscope.schemas.wire import AllBlocksCleared, BlockRemoved, BlockStored, Gap, KVEventBatch

MAX_HINTS_PER_SOURCE = 200_000
"""Routed hints kept per source; expired ones go first, then the oldest."""
MAX_HINTS_PER_REQUEST = 65_536
"""Leading blocks of one routed post kept as hints (a 1M-token prompt at block size 16)."""
RETIRED_EPOCHS_KEPT = 64
"""Replaced epochs remembered per source, to ignore their late records."""

_PLACE = operator.itemgetter(0)
SourceKey = tuple[str, int]
"""(instance, dp_rank)."""
Hashes = Sequence[int] | npt.NDArray[np.uint64] | bytes
"""A request's block hashes: ints, a uint64 array, or little-endian u64s back to back."""
_MSGPACK = msgspec.msgpack.Encoder().encode


@dataclasses.dataclass
class SourceState:
    """What the index knows about one source (changed only by its `PrefixIndex`, which keeps
    the answers of sources that match nothing between requests and renews them on change)."""

    instance: str
    dp_rank: int
    number: int
    """The source's index in score arrays (renumbered when other sources are forgotten)."""
    epoch: int | None = None
    last_seq: int = -1
    stale: bool = False
    stale_reason: str = ""
    model: str = ""
    block_size: int = 0
    last_ts: float = 0.0
    """Engine timestamp of the newest record applied for this source."""
    seen: float = dataclasses.field(default_factory=time.monotonic)
    """When the index last applied a record of this source (monotonic; idle expiry)."""
    slots: dict[str, int] = dataclasses.field(default_factory=dict)
    """Tier name (medium, or medium/tier) -> slot in the block table."""
    retired: list[int] = dataclasses.field(default_factory=list)
    hints: OrderedDict[int, float] = dataclasses.field(default_factory=OrderedDict)
    """Routed hints: hash -> expiry (monotonic seconds), oldest first."""

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
        """Sources by number: dense, renumbered in order when sources are dropped."""
        self._slot_source = np.zeros(0, dtype=np.int64)
        self._slot_weight = np.zeros(0, dtype=np.float64)
        self._source_slots: npt.NDArray[np.int64] | None = None
        """Per source number its slots, padded with -1 (built when scoring needs it)."""
        self._quiet: dict[str, tuple[list[SourceScore], dict[int, int]]] = {}
        """Per model filter: every candidate's answer when it matches nothing, in source
        order, and each number's place in it (emptied whenever a source's answer changes)."""
        self._hinted: set[int] = set()
        """Numbers of the sources that may hold routed hints."""
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
                self._mark_stale(source, f"publisher lost seqs {body.first_seq}..{body.last_seq}")
                continue
            for event in body.events:
                self._event(source, event)
        self._flush()
        if self.table.sweeping:
            self.table.sweep()

    def _admit(self, envelope: Envelope) -> SourceState | None:
        """The record's source if the record is to be applied (epoch and seq rules)."""
        who = envelope.source
        source = self._source(who.instance, who.dp_rank)
        if envelope.epoch != source.epoch:
            if envelope.epoch in source.retired:
                return None
            self._new_epoch(source, envelope.epoch)
            if envelope.seq != 0:
                self._mark_stale(source, f"epoch first seen at seq {envelope.seq}")
        elif envelope.seq <= source.last_seq:
            return None
        elif envelope.seq > source.last_seq + 1:
            self._mark_stale(source, f"seqs {source.last_seq + 1}..{envelope.seq - 1} missing")
        source.last_seq = envelope.seq
        source.seen = time.monotonic()
        if who.model and who.model != source.model:
            source.model = who.model
            self._quiet.clear()
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
        self._quiet.clear()

    def _mark_stale(self, source: SourceState, reason: str) -> None:
        if not source.stale:
            source.mark_stale(reason)
            self._quiet.clear()

    def _event(self, source: SourceState, event: object) -> None:
        if isinstance(event, BlockStored):
            tier = event.medium if event.tier is None else f"{event.medium}/{event.tier}"
            self._ops(self._slot(source, tier), event.block_hashes, STORE)
            if event.block_size:
                source.block_size = event.block_size
            if source.hints:
                hints = source.hints
                for block_hash in event.block_hashes:
                    hints.pop(block_hash, None)
        elif isinstance(event, BlockRemoved):
            tier = event.medium if event.tier is None else f"{event.medium}/{event.tier}"
            self._ops(self._slot(source, tier), event.block_hashes, REMOVE)
        elif isinstance(event, AllBlocksCleared):
            self._clear(source)
            if source.stale:
                source.stale, source.stale_reason = False, ""
                self._quiet.clear()
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
        self.table.drop_slots(list(source.slots.values()))
        source.hints.clear()

    def _source(self, instance: str, dp_rank: int) -> SourceState:
        key = (instance, dp_rank)
        source = self._sources.get(key)
        if source is None:
            source = SourceState(instance, dp_rank, number=len(self._by_number))
            self._by_number.append(source)
            self._sources[key] = source
        return source

    def _slot(self, source: SourceState, tier: str) -> int:
        slot = source.slots.get(tier)
        if slot is None:
            weight = self.tier_weights.get(tier.split("/", 1)[0], 0.5)
            slot = len(self._slot_source)
            self._slot_source = np.append(self._slot_source, -1)
            self._slot_weight = np.append(self._slot_weight, 0.0)
            self.table.ensure_slot(slot)
            source.slots[tier] = slot
            self._slot_source[slot], self._slot_weight[slot] = source.number, weight
            self._source_slots = None
        return slot

    # ---- lifecycle -----------------------------------------------------------------------

    def forget(self, instance: str, dp_rank: int | None = None) -> int:
        """Drop the source (every dp rank of `instance` when `dp_rank` is None) with its
        blocks and hints; returns how many were dropped. A later record of it starts it
        again as a new source."""
        keys = [k for k in self._sources if k[0] == instance and dp_rank in (None, k[1])]
        self._drop(keys)
        return len(keys)

    def forget_idle(self, idle_s: float, now: float | None = None) -> list[SourceKey]:
        """Drop every source no record of which was applied for `idle_s` seconds."""
        limit = (time.monotonic() if now is None else now) - idle_s
        keys = [key for key, source in self._sources.items() if source.seen < limit]
        self._drop(keys)
        return keys

    def _drop(self, keys: list[SourceKey]) -> None:
        """Drop the sources, then number the remaining sources and their slots densely
        again (in their old order, so ties still rank the same); the table drops the
        forgotten slots' blocks in the same step (its sweep deletes their buckets later)."""
        if not keys:
            return
        self._flush()
        for key in keys:
            self._sources.pop(key).hints.clear()
        self._renumber()

    def sweep(self, buckets: int | None = None) -> bool:
        """One bounded step of deleting the table buckets that dropped slots emptied
        (`buckets` of them, default `table.SWEEP_BUCKETS`, about a millisecond); True while
        some are left. Answers never wait for it: they are exact before it runs."""
        return self.table.sweep(buckets)

    def sweep_all(self) -> None:
        """Sweep to the end in one go (tests, benchmarks: not on a serving event loop)."""
        while self.table.sweep(self.table.size):
            pass

    def _renumber(self) -> None:
        """Numbers 0.. for the sources and slots still in use; the table follows (and
        drops what the slots no source uses any more held)."""
        kept = [s for s in self._by_number if self._sources.get((s.instance, s.dp_rank)) is s]
        new_slot = np.full(len(self._slot_source), -1, dtype=np.int64)
        used = sorted(slot for source in kept for slot in source.slots.values())
        new_slot[used] = np.arange(len(used))
        self._slot_source = np.full(len(used), -1, dtype=np.int64)
        self._slot_weight = self._slot_weight[used]
        hinted = set()
        for number, source in enumerate(kept):
            if source.number in self._hinted:
                hinted.add(number)
            source.number = number
            source.slots = {tier: int(new_slot[slot]) for tier, slot in source.slots.items()}
            self._slot_source[list(source.slots.values())] = number
        self._by_number, self._hinted = kept, hinted
        self._source_slots = None
        self._quiet.clear()
        self.table.remap_slots(new_slot)

    @property
    def live_slots(self) -> int:
        """Table slots in use (one per source and tier)."""
        return len(self._slot_source)

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
            self._mark_stale(source, stale_reason)
        source.model, source.block_size, source.last_ts = model, block_size, last_ts
        self._quiet.clear()
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
        block_hashes: Hashes,
        *,
        model: str | None = None,
        now: float | None = None,
        ready: bool = True,
    ) -> ScoreResult:
        """Per source (of `model`, when given): the request's leading blocks it holds, best
        first (ties in source order). `block_hashes`: a sequence of ints, a uint64 array or
        the hashes as little-endian u64 bytes (the last two skip converting Python ints;
        ValueError for a hash outside 0..2**64-1 or a byte count not a multiple of 8).
        `ready`: whether the feed is current (carried to the answer for the router). Only
        the sources that match (or hold routed hints) cost work per request: the others'
        answers are kept from the last request."""
        if self._hashes:
            self._flush()
        request, raw = _packed(block_hashes)
        slots = self._source_slots
        if slots is None:
            slots = self._slots_by_source()
        numbers, matched, weights = self.table.score(
            request, self._slot_source, self._slot_weight, slots, raw=raw
        )
        quiet, place = self._quiet_answers(model or "")
        if not self._hinted:
            if not numbers:  # the common miss: every answer is a quiet one
                return ScoreResult(self.lag_s(now), list(quiet), ready)
            if len(numbers) == 1:  # the common hit: one source holds the prefix
                at = place.get(numbers[0])
                if at is None or not matched[0]:
                    return ScoreResult(self.lag_s(now), list(quiet), ready)
                answer = self._answer(numbers[0], matched[0], weights[0], 0)
                return ScoreResult(self.lag_s(now), _ranked(quiet, [(at, answer)]), ready)
        found: Iterable[tuple[int, int, float]] = zip(numbers, matched, weights, strict=True)
        mono = 0.0
        hashes: Sequence[int] = ()
        if self._hinted:  # every source holding hints is in it
            found = self._with_hinted(list(found))
            mono = time.monotonic()
            hashes = _as_ints(block_hashes)
        changed: list[tuple[int, SourceScore]] = []
        for number, confirmed, weight in found:
            at = place.get(number)
            if at is None:
                continue
            hints = self._by_number[number].hints
            extra = _hinted_run(hints, hashes, confirmed, mono) if hints else 0
            if extra:
                weight += extra * self.tier_weights.get("GPU", 1.0)
            if confirmed or extra:
                changed.append((at, self._answer(number, confirmed + extra, weight, extra)))
        return ScoreResult(self.lag_s(now), _ranked(quiet, changed), ready)

    def _answer(self, number: int, blocks: int, weight: float, extra: int) -> SourceScore:
        """Source `number`'s answer: `blocks` leading blocks (`extra` of them routed hints)
        worth `weight`."""
        source = self._by_number[number]
        return SourceScore(
            source.instance,
            source.dp_rank,
            blocks,
            blocks * source.block_size,
            weight,
            source.stale,
            extra,
            source.model,
        )

    def _with_hinted(self, found: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        """`found` and (number, 0, 0.0) for each source holding hints that `found` lacks
        (sources whose hints are gone leave the hinted set)."""
        listed = {number for number, _, _ in found}
        for number in list(self._hinted):
            if not self._by_number[number].hints:
                self._hinted.discard(number)
            elif number not in listed:
                found.append((number, 0, 0.0))
        return found

    def _slots_by_source(self) -> npt.NDArray[np.int64]:
        """Each source number's slots, padded with -1 (rebuilt after slots change)."""
        if self._source_slots is None:
            tiers = max((len(s.slots) for s in self._sources.values()), default=1)
            table = np.full((len(self._by_number), max(tiers, 1)), -1, dtype=np.int64)
            for source in self._sources.values():
                table[source.number, : len(source.slots)] = list(source.slots.values())
            self._source_slots = table
        return self._source_slots

    def _quiet_answers(self, model: str) -> tuple[list[SourceScore], dict[int, int]]:
        """Every candidate source's answer when it matches nothing, in source order, and
        each source number's place in that list (built once per change of the sources)."""
        kept = self._quiet.get(model)
        if kept is None:
            quiet: list[SourceScore] = []
            place: dict[int, int] = {}
            for source in self._by_number:
                if source.epoch is None or (model and source.model and source.model != model):
                    continue
                place[source.number] = len(quiet)
                quiet.append(
                    SourceScore(
                        source.instance, source.dp_rank, stale=source.stale, model=source.model
                    )
                )
            kept = self._quiet[model] = (quiet, place)
        return kept

    def add_routed(
        self,
        block_hashes: Sequence[int],
        instance: str,
        dp_rank: int = 0,
        *,
        ttl_s: float = 2.0,
    ) -> bool:
        """Hint that a request with these blocks was sent to the source; False if unknown.
        Only the first `MAX_HINTS_PER_REQUEST` blocks are kept (scores count leading runs);
        expired hints, then the oldest, make room under `MAX_HINTS_PER_SOURCE`."""
        source = self._sources.get((instance, dp_rank))
        if source is None or source.epoch is None:
            return False
        self._hinted.add(source.number)
        now = time.monotonic()
        hints = source.hints
        while hints and next(iter(hints.values())) <= now:  # FIFO: expiry order
            hints.popitem(last=False)
        leading = block_hashes[:MAX_HINTS_PER_REQUEST]
        expiry = now + ttl_s
        for block_hash in leading:
            hints[block_hash] = expiry
            hints.move_to_end(block_hash)
        while len(hints) > MAX_HINTS_PER_SOURCE:
            hints.popitem(last=False)
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


def _packed(block_hashes: Hashes) -> tuple[bytes, bool]:
    """A request as the table reads it, and whether it is raw u64s (else msgpack): msgspec
    encodes a list of 100 ints in about half the time `array("Q", ...)` takes."""
    if isinstance(block_hashes, bytes):
        return block_hashes, True
    if isinstance(block_hashes, np.ndarray):
        if block_hashes.dtype.kind != "u":  # a signed or float array may hold what no u64 is
            raise TypeError(f"block hashes as an array are uint64, not {block_hashes.dtype}")
        return block_hashes.astype("<u8", copy=False).tobytes(), True
    try:
        return _MSGPACK(block_hashes), False
    except (TypeError, OverflowError):  # not a list or tuple of ints (numpy's ints, a range)
        return array.array("Q", block_hashes).tobytes(), True


def _as_ints(block_hashes: Hashes) -> Sequence[int]:
    """The request's hashes as Python ints (for routed hints, which Python dicts hold)."""
    if isinstance(block_hashes, bytes):
        return np.frombuffer(block_hashes, dtype="<u8").tolist()  # type: ignore[no-any-return]
    if isinstance(block_hashes, np.ndarray):
        return block_hashes.tolist()  # type: ignore[no-any-return]
    return block_hashes


def _hinted_run(hints: Mapping[int, float], hashes: Sequence[int], start: int, now: float) -> int:
    """How many blocks from `start` on are routed hints that have not expired."""
    run = 0
    for block_hash in hashes[start:]:
        if hints.get(block_hash, 0.0) <= now:
            break
        run += 1
    return run


def _ranked(quiet: list[SourceScore], changed: list[tuple[int, SourceScore]]) -> list[SourceScore]:
    """`quiet` with the answers in `changed` (place, answer) put in their places, ordered
    as a stable sort by score, best first, would order them; in time that follows the
    changed answers (the quiet ones all score 0 and keep their order)."""
    if not changed:
        return list(quiet)
    if len(changed) == 1:  # the common case: one source holds the request's prefix
        at, answer = changed[0]
        if answer.score > 0:
            ranked = [answer]
            ranked += quiet  # a copy and a deletion: half the time of joining two slices
            del ranked[at + 1]
            return ranked
    changed.sort(key=_best_first)
    ranked = [answer for _, answer in changed if answer.score > 0]
    start = 0
    for at, answer in sorted(changed, key=_PLACE):
        ranked += quiet[start:at]
        if answer.score == 0:
            ranked.append(answer)
        start = at + 1
    ranked += quiet[start:]
    ranked += [answer for _, answer in changed if answer.score < 0]
    return ranked


def _best_first(item: tuple[int, SourceScore]) -> tuple[float, int]:
    """Sort key of a (place, answer): higher scores first, then the earlier place."""
    return -item[1].score, item[0]

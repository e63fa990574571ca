"""Hostile kv-events streams for the index tests, and an independent replay of their rules.

`hostile_stream` writes what a fleet's publishers could put on the kv-events topic: several
instances and DP ranks, GPU/CPU/remote tiers, duplicate copies of a hash, removals of
hashes never stored, AllBlocksCleared, engine restarts (new epochs), late records of a
replaced epoch, publisher retries (a record twice), `Gap` records and seq holes.
`Replay` applies the documented rules with plain dicts (written apart from the index's
numba table) and says what each source must hold.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Iterable

from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import AllBlocksCleared, BlockRemoved, BlockStored, Gap, KVEventBatch

TIERS = [("GPU", None), ("CPU", None), ("DISK", "REMOTE/obj-1")]


def hostile_stream(
    seed: int, records: int, sources: int = 4, universe: int = 400
) -> list[Envelope]:
    """`records` envelopes (plus duplicates and late ones) from `sources` sources."""
    rng = random.Random(seed)
    who = [
        Source(instance=f"engine-{i // 2}", dp_rank=i % 2, model="m" if i % 3 else "other")
        for i in range(sources)
    ]
    epochs = {s.key: rng.getrandbits(64) for s in who}
    seqs = {s.key: 0 for s in who}
    held: dict[str, list[tuple[int, int]]] = {s.key: [] for s in who}
    hashes = [rng.getrandbits(64) for _ in range(universe)]
    out: list[Envelope] = []
    replaced: list[Envelope] = []
    for n in range(records):
        source = rng.choice(who)
        key = source.key
        roll = rng.random()
        if roll < 0.02:  # engine restart: a new epoch, seq from 0 again
            epochs[key], seqs[key], held[key] = rng.getrandbits(64), 0, []
        elif roll < 0.04:  # publisher lost records: a hole
            seqs[key] += rng.randint(1, 3)
        body: object
        if roll > 0.98:
            body = Gap(first_seq=seqs[key], last_seq=seqs[key] + 1, reason="queue_full")
            seqs[key] += 2
        else:
            body = KVEventBatch(ts=1000.0 + n, events=_events(rng, hashes, held[key]))
        envelope = Envelope(
            source=source, epoch=epochs[key], seq=seqs[key], ts=1000.0 + n, body=body
        )
        seqs[key] += 1
        out.append(envelope)
        if rng.random() < 0.05:  # a publisher retry: the same record again, later
            out.append(envelope)
        if roll < 0.02 and replaced:  # a late record of some replaced epoch
            out.append(replaced.pop())
        if rng.random() < 0.03:
            replaced.append(envelope)
    return out


def _events(rng: random.Random, hashes: list[int], held: list[tuple[int, int]]) -> list[object]:
    events: list[object] = []
    for _ in range(rng.randint(0, 4)):
        roll = rng.random()
        medium, tier = rng.choice(TIERS)
        tier_index = TIERS.index((medium, tier))
        if roll < 0.55:
            start = rng.randrange(len(hashes))
            chain = hashes[start : start + rng.randint(1, 12)]
            if held and rng.random() < 0.1:  # a second copy of a held hash
                chain = [held[rng.randrange(len(held))][1]]
                tier_index = held[0][0]
                medium, tier = TIERS[tier_index]
            events.append(BlockStored(block_hashes=chain, block_size=16, medium=medium, tier=tier))
            held.extend((tier_index, h) for h in chain)
        elif roll < 0.97:
            if held and rng.random() < 0.85:
                picked = [held.pop(rng.randrange(len(held))) for _ in range(min(len(held), 3))]
                by_tier = collections.defaultdict(list)
                for t, h in picked:
                    by_tier[t].append(h)
                for t, hs in by_tier.items():
                    medium, tier = TIERS[t]
                    events.append(BlockRemoved(block_hashes=hs, medium=medium, tier=tier))
            else:  # removal of a hash never stored
                events.append(
                    BlockRemoved(block_hashes=[rng.choice(hashes)], medium=medium, tier=tier)
                )
        else:
            events.append(AllBlocksCleared())
            held.clear()
    return events


@dataclasses.dataclass
class _RefSource:
    epoch: int | None = None
    last: int = -1
    stale: bool = False
    retired: set[int] = dataclasses.field(default_factory=set)
    copies: collections.Counter[tuple[str, int]] = dataclasses.field(
        default_factory=collections.Counter
    )


class Replay:
    """The index's rules over plain dicts: what each (instance, dp_rank) holds, and staleness."""

    def __init__(self) -> None:
        self.sources: dict[tuple[str, int], _RefSource] = {}

    def apply(self, envelope: Envelope) -> None:
        """Apply one record as docs/index.md says."""
        ref = self.sources.setdefault(
            (envelope.source.instance, envelope.source.dp_rank), _RefSource()
        )
        if envelope.epoch != ref.epoch:
            if envelope.epoch in ref.retired:
                return
            if ref.epoch is not None:
                ref.retired.add(ref.epoch)
            ref.epoch, ref.last, ref.copies = envelope.epoch, -1, collections.Counter()
            ref.stale = envelope.seq != 0
        elif envelope.seq <= ref.last:
            return
        elif envelope.seq != ref.last + 1:
            ref.stale = True
        ref.last = envelope.seq
        body = envelope.body
        if isinstance(body, Gap):
            ref.stale = True
            return
        assert isinstance(body, KVEventBatch)
        for event in body.events:
            if isinstance(event, AllBlocksCleared):
                ref.copies.clear()
                ref.stale = False
                continue
            tier = event.medium if event.tier is None else f"{event.medium}/{event.tier}"
            for block_hash in event.block_hashes:
                if isinstance(event, BlockStored):
                    ref.copies[(tier, block_hash)] += 1
                elif ref.copies[(tier, block_hash)] > 0:
                    ref.copies[(tier, block_hash)] -= 1
        ref.copies = +ref.copies

    def resident(self, instance: str, dp_rank: int) -> set[int]:
        """Hashes the source holds in any tier."""
        ref = self.sources.get((instance, dp_rank))
        return {h for _, h in ref.copies} if ref else set()

    def tiers(self, instance: str, dp_rank: int) -> dict[str, int]:
        """Distinct hashes per tier (tiers holding none left out)."""
        counts: collections.Counter[str] = collections.Counter()
        ref = self.sources.get((instance, dp_rank))
        for tier, _ in ref.copies if ref else ():
            counts[tier] += 1
        return dict(counts)


def replayed_state(envelopes: Iterable[Envelope]) -> dict[tuple[str, int], tuple[set[int], bool]]:
    """What an index must hold after `envelopes`, in the shape `IndexProcess.state()` gives:
    per (instance, dp_rank), the resident hashes and whether the source is stale."""
    replay = Replay()
    for envelope in envelopes:
        replay.apply(envelope)
    return {key: (replay.resident(*key), ref.stale) for key, ref in replay.sources.items()}

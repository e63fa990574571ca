"""PrefixIndex against an independent replay of its rules, over hostile streams of many shapes."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest
from kvscope.index import table
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import AllBlocksCleared, BlockRemoved, BlockStored, Gap, KVEventBatch
from support.index_streams import Replay, hostile_stream


def _resident(index: PrefixIndex, instance: str, dp_rank: int) -> set[int]:
    hashes, cursor = index.resident(instance, dp_rank, limit=37)
    out = set(hashes)
    while cursor is not None:
        page, cursor = index.resident(instance, dp_rank, start=cursor, limit=37)
        out.update(page)
    return out


@pytest.mark.parametrize(
    ("seed", "records", "sources", "universe"),
    [(1, 50, 1, 20), (2, 400, 4, 50), (3, 1500, 6, 400), (4, 3000, 12, 5000), (5, 800, 2, 3)],
)
@pytest.mark.parametrize("chunk", [1, 17, 10_000])
def test_the_index_holds_what_the_replay_holds(
    seed: int, records: int, sources: int, universe: int, chunk: int
) -> None:
    stream = hostile_stream(seed, records, sources, universe)
    index, replay = PrefixIndex(), Replay()
    for start in range(0, len(stream), chunk):
        index.apply_all(stream[start : start + chunk])
    for envelope in stream:
        replay.apply(envelope)
    infos = {(i.instance, i.dp_rank): i for i in index.sources()}
    assert set(infos) == set(replay.sources)
    for (instance, dp_rank), ref in replay.sources.items():
        info = infos[(instance, dp_rank)]
        assert _resident(index, instance, dp_rank) == replay.resident(instance, dp_rank)
        assert {t: n for t, n in info.tiers.items() if n} == replay.tiers(instance, dp_rank)
        assert (info.epoch, info.stale) == (ref.epoch, ref.stale)


def _env(seq: int, body: object, epoch: int = 7, instance: str = "a", dp_rank: int = 0) -> Envelope:
    return Envelope(
        source=Source(instance=instance, dp_rank=dp_rank, model="m"),
        epoch=epoch,
        seq=seq,
        ts=100.0 + seq,
        body=body,  # type: ignore[arg-type]
    )


def _stored(hashes: list[int], medium: str = "GPU") -> KVEventBatch:
    return KVEventBatch(
        ts=0, events=[BlockStored(block_hashes=hashes, block_size=16, medium=medium)]
    )  # type: ignore[arg-type]


def test_removing_one_of_two_copies_keeps_the_block() -> None:
    index = PrefixIndex()
    index.apply_all([_env(0, _stored([5])), _env(1, _stored([5]))])
    index.apply(_env(2, KVEventBatch(ts=0, events=[BlockRemoved(block_hashes=[5])])))
    assert _resident(index, "a", 0) == {5}
    index.apply(_env(3, KVEventBatch(ts=0, events=[BlockRemoved(block_hashes=[5])])))
    assert _resident(index, "a", 0) == set()


def test_a_gap_makes_exactly_that_source_stale_until_a_clear() -> None:
    index = PrefixIndex()
    index.apply_all([_env(0, _stored([1]), instance="a"), _env(0, _stored([1]), instance="b")])
    index.apply(_env(1, Gap(first_seq=1, last_seq=1), instance="a"))
    stale = {i.instance: i.stale for i in index.sources()}
    assert stale == {"a": True, "b": False}
    scores = {s.instance: s.stale for s in index.score([1]).sources}
    assert scores == {"a": True, "b": False}
    index.apply(_env(2, KVEventBatch(ts=0, events=[AllBlocksCleared()]), instance="a"))
    assert not any(i.stale for i in index.sources())


def test_a_new_epoch_replaces_the_old_state_and_late_records_are_ignored() -> None:
    index = PrefixIndex()
    index.apply_all([_env(0, _stored([1, 2]), epoch=1), _env(1, _stored([3]), epoch=1)])
    index.apply(_env(0, _stored([9]), epoch=2))
    index.apply(_env(2, _stored([4]), epoch=1))  # late record of the replaced run
    assert _resident(index, "a", 0) == {9}
    index.apply(_env(5, _stored([10]), epoch=3))  # a run first seen past seq 0
    assert [i.stale for i in index.sources()] == [True]


@pytest.mark.parametrize("n_sources", [1, 3, 64, 130])
@pytest.mark.parametrize("length", [0, 1, 10, 100])
def test_score_is_the_leading_run_held_in_any_tier_weighted_by_the_best(
    n_sources: int, length: int
) -> None:
    rng = random.Random(n_sources * 1000 + length)
    chain = [rng.getrandbits(64) for _ in range(length)]
    index = PrefixIndex({"GPU": 1.0, "CPU": 0.5})
    expected = {}
    for s in range(n_sources):
        held = rng.randint(0, length)
        on_cpu = rng.randint(0, held)
        events = [BlockStored(block_hashes=chain[on_cpu:held], block_size=16, medium="GPU")]
        events.append(BlockStored(block_hashes=chain[:on_cpu], block_size=16, medium="CPU"))
        index.apply(_env(0, KVEventBatch(ts=0, events=events), instance=f"s{s}"))  # type: ignore[arg-type]
        expected[f"s{s}"] = (held, on_cpu * 0.5 + (held - on_cpu) * 1.0)
    result = index.score(chain)
    got = {s.instance: (s.matched_blocks, s.score) for s in result.sources}
    assert got == expected  # multiples of 0.5: exact in floating point
    assert [s.score for s in result.sources] == sorted(
        (s.score for s in result.sources), reverse=True
    )
    assert all(s.matched_tokens == 16 * s.matched_blocks for s in result.sources)


def test_routed_hints_extend_scores_expire_and_never_show_as_resident() -> None:
    index = PrefixIndex()
    index.apply(_env(0, _stored([1])))
    assert index.add_routed([1, 2, 3], "a", 0, ttl_s=60)
    assert not index.add_routed([1], "nobody", 0)
    (only,) = index.score([1, 2, 3, 4]).sources
    assert (only.matched_blocks, only.speculative_blocks) == (3, 2)
    assert _resident(index, "a", 0) == {1}
    index.add_routed([5], "a", 0, ttl_s=1e-9)
    assert index.score([1, 5]).sources[0].matched_blocks == 1
    # a source known only from hints for this request ranks by them; others stay at 0
    index.apply(_env(0, _stored([7]), instance="b"))
    index.apply(_env(0, _stored([8]), instance="c"))
    assert index.add_routed([9, 10], "b", 0, ttl_s=60)
    got = [
        (s.instance, s.matched_blocks, s.speculative_blocks) for s in index.score([9, 10]).sources
    ]
    assert got == [("b", 2, 2), ("a", 0, 0), ("c", 0, 0)]


def test_a_model_filter_keeps_only_that_models_sources() -> None:
    index = PrefixIndex()
    index.apply(_env(0, _stored([1]), instance="a"))
    other = Envelope(
        source=Source(instance="b", model="n"), epoch=1, seq=0, ts=1.0, body=_stored([1])
    )
    index.apply(other)
    assert [s.instance for s in index.score([1], model="n").sources] == ["b"]
    assert {s.instance for s in index.score([1]).sources} == {"a", "b"}


def _expected_scores(
    index: PrefixIndex, replay: Replay, order: list[tuple[str, int]], models: dict, request: list
) -> list[tuple[str, int, int, int, float, bool, int, str]]:
    """The answer every source must get, from the replay's plain dicts: leading run held in
    any tier, summed best tier weights, then a stable sort by score (sources in first-seen
    order), as the index's docs say."""
    rows = []
    for instance, dp_rank in order:
        ref = replay.sources[(instance, dp_rank)]
        best: dict[int, float] = {}
        for tier, block_hash in ref.copies:
            weight = index.tier_weights.get(tier.split("/", 1)[0], 0.5)
            best[block_hash] = max(best.get(block_hash, -1.0), weight)
        run = 0
        while run < len(request) and request[run] in best:
            run += 1
        state = index.source(instance, dp_rank)
        assert state is not None
        score = sum(best[h] for h in request[:run])
        model = models[(instance, dp_rank)]
        rows.append((instance, dp_rank, run, run * state.block_size, score, ref.stale, 0, model))
    return sorted(rows, key=lambda row: -row[4])


@pytest.mark.parametrize(("seed", "sources"), [(11, 3), (12, 12), (13, 70)])
@pytest.mark.parametrize("sweep_buckets", [table.SWEEP_BUCKETS, 2])
def test_scores_match_the_replay_while_the_stream_changes_sources(
    monkeypatch: pytest.MonkeyPatch, seed: int, sources: int, sweep_buckets: int
) -> None:
    """Exact answers (values, stale flags, order, the sources that match nothing) after every
    chunk of a hostile stream: answers kept between requests follow staleness, epochs and
    forgotten sources (the others renumbered), whether the buckets those emptied are swept
    at once or a few at a time."""
    monkeypatch.setattr(table, "SWEEP_BUCKETS", sweep_buckets)
    stream = hostile_stream(seed, records=500, sources=sources, universe=60)
    rng = random.Random(seed)
    universe = sorted(
        {
            h
            for e in stream
            if isinstance(e.body, KVEventBatch)
            for ev in e.body.events
            if isinstance(ev, BlockStored)
            for h in ev.block_hashes
        }
    )
    index, replay = PrefixIndex(), Replay()
    order: list[tuple[str, int]] = []
    models: dict[tuple[str, int], str] = {}
    start = 0
    while start < len(stream):
        chunk = stream[start : start + rng.choice((1, 1, 2, 40))]
        start += len(chunk)
        index.apply_all(chunk)
        for envelope in chunk:
            replay.apply(envelope)
            key = (envelope.source.instance, envelope.source.dp_rank)
            if key not in models:
                order.append(key)
                models[key] = envelope.source.model
        if order and rng.random() < 0.1:  # a source forgotten (it may publish again)
            key = order.pop(rng.randrange(len(order)))
            assert index.forget(*key) == 1
            del replay.sources[key], models[key]
        for _ in range(2):
            request = [rng.choice(universe) for _ in range(rng.randint(0, 3))]
            request += universe[(at := rng.randrange(len(universe))) : at + rng.randint(0, 30)]
            for model in (None, "other"):
                got = [
                    tuple(msgspec.structs.astuple(s))
                    for s in index.score(request, model=model).sources
                ]
                expected = [
                    row
                    for row in _expected_scores(index, replay, order, models, request)
                    if model is None or row[7] == model
                ]
                assert got == expected
                packed = np.array(request, dtype=np.uint64).tobytes()
                assert (
                    index.score(packed, model=model).sources
                    == index.score(request, model=model).sources
                )
    index.sweep_all()
    assert index.table.zombies == 0
    for key in order:
        assert _resident(index, *key) == replay.resident(*key)


@pytest.mark.parametrize(("seed", "sources"), [(31, 3), (32, 70), (33, 130)])
def test_scores_between_churn_chunks_match_the_replay(seed: int, sources: int) -> None:
    """Steady-state churn (new GPU blocks, the oldest moved to CPU, the oldest CPU ones
    dropped; a prefix every source shares) in chunks, with requests hitting many sources,
    one or none, and refused ones, between them: every answer is the replay's. Score reuses
    its working space (each source's place in the answer, the set masks' scratch row) from
    request to request and shares it with the applies, so none may leave a trace."""
    rng = random.Random(seed)
    shared = [rng.getrandbits(64) for _ in range(6)]
    gpu = {s: shared + [rng.getrandbits(64) for _ in range(10)] for s in range(sources)}
    cpu: dict[int, list[int]] = {s: [] for s in range(sources)}
    seqs = dict.fromkeys(range(sources), 0)

    def record(s: int, events: list[object]) -> Envelope:
        seqs[s] += 1
        body = KVEventBatch(ts=0, events=events)  # type: ignore[arg-type]
        return _env(seqs[s] - 1, body, instance=f"s{s}")

    stream = [record(s, [BlockStored(block_hashes=gpu[s], block_size=16)]) for s in gpu]
    for _ in range(8 * sources):
        s = rng.randrange(sources)
        new = [rng.getrandbits(64) for _ in range(rng.randint(1, 4))]
        evicted, gpu[s] = gpu[s][: len(new)], gpu[s][len(new) :] + new
        dropped, cpu[s] = cpu[s][:2], cpu[s][2:] + evicted
        events = [
            BlockStored(block_hashes=new, block_size=16),
            BlockRemoved(block_hashes=evicted),
            BlockStored(block_hashes=evicted, block_size=16, medium="CPU"),
            BlockRemoved(block_hashes=dropped, medium="CPU"),
        ]
        stream.append(record(s, events))
    index, replay = PrefixIndex(), Replay()
    order: list[tuple[str, int]] = []  # sources in first-seen order
    start = 0
    while start < len(stream):
        chunk = stream[start : start + rng.choice((1, 7, 50))]
        start += len(chunk)
        index.apply_all(chunk)
        for envelope in chunk:
            replay.apply(envelope)
            if (envelope.source.instance, 0) not in order:
                order.append((envelope.source.instance, 0))
        models = dict.fromkeys(order, "m")
        for _ in range(3):
            s = rng.randrange(sources)
            held = cpu[s] + gpu[s]
            at = rng.randrange(len(held))
            request = rng.choice((shared, [])) + held[at : at + rng.randint(1, 12)]
            if rng.random() < 0.3:
                request.append(rng.getrandbits(64))
            got = [tuple(msgspec.structs.astuple(a)) for a in index.score(request).sources]
            assert got == _expected_scores(index, replay, order, models, request)
        with pytest.raises(ValueError):
            index.score(b"\x00" * 12, model="m")  # refused: not a whole number of u64s
    for key in order:
        assert _resident(index, *key) == replay.resident(*key)

"""Sources that come and go: `forget`, idle expiry, reuse of slots and slot sets, hint caps."""

from __future__ import annotations

import random

import pytest
from kvscope.index import state
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch
from support.index_streams import Replay, hostile_stream


def _env(instance: str, seq: int, hashes: list[int], epoch: int = 1) -> Envelope:
    events = [BlockStored(block_hashes=hashes, block_size=16, medium="GPU")]
    body = KVEventBatch(ts=0, events=events)  # type: ignore[arg-type]
    return Envelope(
        source=Source(instance=instance, model="m"), epoch=epoch, seq=seq, ts=1.0, body=body
    )


@pytest.mark.parametrize(("total", "live", "shared"), [(40, 3, 5), (700, 64, 50), (3000, 64, 20)])
def test_churned_sources_leave_memory_and_slots_to_the_live_ones(
    total: int, live: int, shared: int
) -> None:
    rng = random.Random(total)
    prefix = [rng.getrandbits(64) for _ in range(shared)]
    index = PrefixIndex()
    alive: list[str] = []
    for n in range(total):
        name = f"pod-{n}"
        own = [rng.getrandbits(64) for _ in range(rng.randint(1, 30))]
        index.apply(_env(name, 0, prefix[: rng.randint(0, shared)] + own))
        alive.append(name)
        if len(alive) > live:
            assert index.forget(alive.pop(rng.randrange(len(alive)))) == 1
    assert {i.instance for i in index.sources()} == set(alive)
    assert index.live_slots == len(alive)
    assert index.table.max_slots <= 64 * (len(alive) // 64 + 1)  # one more at the peak
    index.sweep_all()
    assert index.table.sets_in_use <= index.table.hashes  # at most one set per hash
    # a fresh index fed only the live sources' blocks holds exactly the same
    fresh = PrefixIndex()
    for name in alive:
        fresh.apply(_env(name, 0, index.resident(name, 0, limit=10_000)[0]))
    assert index.table.hashes == fresh.table.hashes
    scores = {s.instance: s.matched_blocks for s in index.score(prefix).sources}
    assert scores == {s.instance: s.matched_blocks for s in fresh.score(prefix).sources}


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_forgetting_some_sources_of_a_hostile_stream_keeps_the_others_exact(seed: int) -> None:
    stream = hostile_stream(seed, records=900, sources=6, universe=300)
    index, replay = PrefixIndex(), Replay()
    index.apply_all(stream[:450])
    gone = sorted({(e.source.instance, e.source.dp_rank) for e in stream[:450]})[::2]
    for instance, dp_rank in gone:
        assert index.forget(instance, dp_rank) == 1
        assert index.forget(instance, dp_rank) == 0
    index.apply_all(stream[450:])
    later = [e for e in stream[450:] if (e.source.instance, e.source.dp_rank) not in gone]
    for envelope in stream[:450] + later:
        if (envelope.source.instance, envelope.source.dp_rank) not in gone:
            replay.apply(envelope)
    for key in replay.sources:
        hashes, cursor = index.resident(*key, limit=100_000)
        assert cursor is None and set(hashes) == replay.resident(*key)


def test_forget_without_dp_rank_drops_every_rank_and_idle_expiry_only_the_silent() -> None:
    index = PrefixIndex()
    for rank in range(3):
        index.apply(
            Envelope(
                source=Source(instance="a", dp_rank=rank, model="m"),
                epoch=1,
                seq=0,
                ts=1.0,
                body=_env("a", 0, [rank]).body,
            )
        )
    index.apply(_env("b", 0, [7]))
    assert index.forget("a") == 3
    assert [i.instance for i in index.sources()] == ["b"]
    index.apply(_env("c", 0, [8]))
    seen_c = index.source("c", 0)
    assert seen_c is not None
    assert index.forget_idle(1.0, now=seen_c.seen + 0.5) == []
    index.source("b", 0).seen -= 10  # type: ignore[union-attr]
    assert index.forget_idle(1.0, now=seen_c.seen + 0.5) == [("b", 0)]
    assert [i.instance for i in index.sources()] == ["c"]


@pytest.mark.parametrize("posts", [1, 3, 7])
def test_hints_never_exceed_the_caps_and_the_newest_post_stays(
    monkeypatch: pytest.MonkeyPatch, posts: int
) -> None:
    monkeypatch.setattr(state, "MAX_HINTS_PER_SOURCE", 1000)
    monkeypatch.setattr(state, "MAX_HINTS_PER_REQUEST", 400)
    index = PrefixIndex()
    index.apply(_env("a", 0, [1]))
    source = index.source("a", 0)
    assert source is not None
    last: list[int] = []
    for post in range(posts):
        last = list(range(10_000 * (post + 1), 10_000 * (post + 1) + 5_000))
        assert index.add_routed([1, *last], "a", 0, ttl_s=60)
        assert len(source.hints) <= 1000
    (only,) = index.score([1, *last]).sources
    assert only.speculative_blocks == 399  # the post's leading 400 blocks, 1 confirmed


def test_expired_hints_leave_from_the_front_in_insertion_order() -> None:
    index = PrefixIndex()
    index.apply(_env("a", 0, [1]))
    index.add_routed(list(range(100, 200)), "a", 0, ttl_s=1e-9)
    index.add_routed(list(range(300, 310)), "a", 0, ttl_s=60)
    source = index.source("a", 0)
    assert source is not None and list(source.hints) == list(range(300, 310))

"""The router's index gate on a real `PrefixIndex` in process: a hash seed that differs from
the engines' is warned about once (after `UNMATCHED_WARNING` prompts matched no published
block), a matching one never; and the gate's decisions say on what basis they routed."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kvscope.index.hashing import BlockHasher
from kvscope.index.state import PrefixIndex
from kvscope.route import index_gate
from kvscope.route.index_client import InProcessIndexClient, Prompt
from kvscope.route.index_gate import UNMATCHED_WARNING, IndexGate
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch

BLOCK = 16


def published(engine_seed: str | None, prompts: list[list[int]]) -> PrefixIndex:
    """An index holding the blocks an engine of `engine_seed` published for `prompts`."""
    index = PrefixIndex()
    hasher = BlockHasher("sha256", engine_seed)
    for seq, ids in enumerate(prompts):
        hashes = hasher.block_hashes(ids, BLOCK)
        event = BlockStored(block_hashes=hashes, block_size=BLOCK, token_count=len(ids))
        body = KVEventBatch(ts=float(seq), events=[event])
        source = Source(instance="e0", model="m")
        index.apply(Envelope(source=source, epoch=1, seq=seq, ts=float(seq), body=body))
    return index


@pytest.mark.parametrize(("engine_seed", "router_seed", "warned"),
                         [(None, "0", True), ("0", None, True), ("0", "0", False),
                          (None, None, False)])  # fmt: skip
def test_a_hash_seed_unlike_the_engines_is_warned_about_once(
    engine_seed: str | None, router_seed: str | None, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    shared = list(range(1, 1 + 4 * BLOCK))
    index = published(engine_seed, [shared])
    client = InProcessIndexClient(index, BlockHasher("sha256", router_seed).block_hashes)
    gate = IndexGate(client, budget_s=1.0)

    async def main() -> list[str]:
        bases = []
        for i in range(UNMATCHED_WARNING + 5):
            scores, basis = await gate.score(Prompt([*shared, i], "m"))
            assert scores is not None
            bases.append(basis)
        return bases

    with caplog.at_level(logging.WARNING, logger="kvscope.route.index_gate"):
        bases = asyncio.run(main())
    assert set(bases) == {"index"}
    warnings = [r for r in caplog.records if "matched no block" in r.getMessage()]
    assert len(warnings) == (1 if warned else 0)


def test_a_stopped_feed_and_a_salt_are_told_apart() -> None:
    shared = list(range(1, 1 + 2 * BLOCK))
    index = published(None, [shared])
    problem: list[str] = []
    client = InProcessIndexClient(
        index,
        BlockHasher("sha256", None).block_hashes,
        failure=lambda: problem[0] if problem else None,
    )
    gate = IndexGate(client, budget_s=1.0)

    async def main() -> list[tuple[int, str]]:
        answers = []
        for prompt in (Prompt(shared, "m"), Prompt(shared, "m", cache_salt="s")):
            scores, basis = await gate.score(prompt)
            assert scores is not None
            answers.append((max(s.matched_tokens for s in scores.sources), basis))
        problem.append("the feed stopped")
        scores, basis = await gate.score(Prompt(shared, "m"))
        answers.append((0 if scores is None else -1, basis))
        return answers

    assert asyncio.run(main()) == [(2 * BLOCK, "index"), (0, "index"), (0, "index_down")]
    assert gate.describe() == {"state": "down", "detail": "the feed stopped"}


@pytest.mark.parametrize("states", [["not_ready", "not_ready", "ok", "ok"],
                                    ["down", "ok", "down", "not_ready", "ok", "ok"]])  # fmt: skip
def test_the_health_watch_asks_more_often_while_the_index_is_not_ok(
    states: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pause of the watch is read off its `asyncio.sleep` (replaced here: the test asks
    what the watch waits for, not how long a wait takes)."""
    answers = iter(states)
    pauses: list[float] = []

    async def health() -> tuple[str, str]:
        return next(answers), ""

    async def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) > len(states):
            raise asyncio.CancelledError

    monkeypatch.setattr(index_gate.asyncio, "sleep", pause)
    gate = IndexGate(None, budget_s=0.02, health=health)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(gate.watch(5.0))
    seen = ["ok", *states]  # the state each pause follows (none polled before the first)
    assert pauses == [5.0 if s == "ok" else index_gate.RECOVERY_POLL_S for s in seen]


class Clock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("answered", [[True, True, False, True, False, False],
                                      [False, True, True, True, True, False]])  # fmt: skip
def test_the_health_watch_skips_polls_while_requests_show_the_index_ready(
    answered: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wait of the watch moves the clock by its length; within it a request is scored
    (`answered`) or not. A poll follows exactly the waits without a ready answer."""
    shared = list(range(1, 1 + 2 * BLOCK))
    client = InProcessIndexClient(
        published(None, [shared]), BlockHasher("sha256", None).block_hashes
    )
    clock = Clock()
    polled: list[int] = []
    waits: list[float] = []

    async def health() -> tuple[str, str]:
        polled.append(len(waits))
        return "ok", ""

    gate = IndexGate(client, budget_s=1.0, health=health, clock=clock)

    async def pause(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > len(answered):
            raise asyncio.CancelledError
        clock.now += seconds / 2
        if answered[len(waits) - 1]:
            assert (await gate.score(Prompt(shared, "m")))[1] == "index"
        clock.now += seconds / 2

    monkeypatch.setattr(index_gate.asyncio, "sleep", pause)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(gate.watch(1.0))
    assert polled == [i + 1 for i, scored in enumerate(answered) if not scored]
    assert waits == [1.0] * (len(answered) + 1)

"""When the index's feed says it is caught up (`kvscope index`'s /healthz 200) on the real
broker: exactly when every record the topic held at assignment is applied, decided from
the ends asked at assignment, with partitions that hold no record at all (a fleet of a
few sources leaves some of the topic's partitions empty) counted as read. Asking the ends
again instead waits behind the consumer's pending fetch, half a second of every restart
(docs/index.md, "Restart")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index import feed as feed_module
from kvscope.index.feed import IndexFeed
from kvscope.index.state import PrefixIndex
from support.collector_testkit import publish_envelopes
from support.index_streams import hostile_stream, replayed_state


async def _ready_state(feed: IndexFeed, asked: list[bool]) -> dict[Any, Any]:
    """Run `feed` until caught up; the state (as `replayed_state` shapes it) and the
    records applied at that moment. `asked` notes each time the ends were asked again."""
    at_end = feed._at_end

    async def asking() -> bool:
        asked.append(True)
        return await at_end()

    feed._at_end = asking  # type: ignore[method-assign]
    task = asyncio.create_task(feed.run())
    try:
        await asyncio.wait_for(feed.caught_up.wait(), 60)
        index = feed.index
        return {
            (s.instance, s.dp_rank): (set(index.resident(s.instance, s.dp_rank, limit=10**6)[0]),
                                      s.stale)
            for s in index.sources()
        }  # fmt: skip
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feed.stop()


@pytest.mark.parametrize(
    ("sources", "records", "max_records"),
    [(1, 30, 500), (2, 200, 7), (5, 600, 64), (8, 1500, 500)],
)
def test_caught_up_exactly_when_the_records_at_assignment_are_applied(
    bootstrap_servers: str,
    topic_prefix: str,
    sources: int,
    records: int,
    max_records: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no empty fetch (and so no asking the ends again) before the records arrive, however
    # slow the machine: only what the fetched records and watermarks say can be the answer
    monkeypatch.setattr(feed_module, "FETCH_WAIT_S", 20.0)
    stream = hostile_stream(sources * 7 + records, records, sources=sources, universe=300)
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", stream))
    feed = IndexFeed(
        PrefixIndex(),
        KafkaSettings(bootstrap_servers=bootstrap_servers),
        f"{topic_prefix}kv-events",
        max_records=max_records,
    )
    asked: list[bool] = []
    state = asyncio.run(_ready_state(feed, asked))
    assert sum(feed.positions.values()) == len(stream)  # every record, not one more fetch
    assert state == replayed_state(stream)
    assert asked == []  # decided from the ends known at assignment

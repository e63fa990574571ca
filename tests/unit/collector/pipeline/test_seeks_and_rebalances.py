"""Seeks the collector queued are not applied once a rebalance came in while one waited.

A seek to a partition's first offset (a new log) waits for the broker's answer. A rebalance
meanwhile revokes the partitions and positions the new assignment from the stored offsets;
the seeks still queued, and the expected offset of the one that waited, belong to the
revoked assignment. Applied anyway, they would move the new position past records that
were never stored. A real broker cannot be made to rebalance at that instant, so the source
here is a fake that runs the rebalance hooks inside its seek (it stands in for
`KafkaSource` only for that).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.service import Collector

FIRST, SECOND = TopicPartition("t.kv-events", 0), TopicPartition("t.kv-events", 1)
STORED = {FIRST: 49, SECOND: 7}


class RebalancingSource:
    """Records every seek; the first one lets the collector's revoke and positioning
    hooks run (as aiokafka's coordinator task would) before it returns."""

    def __init__(self, collector: Collector, rebalance: bool) -> None:
        self.collector = collector
        self.rebalance = rebalance
        self.seeks: list[tuple[TopicPartition, int | None]] = []

    async def seek(self, tp: TopicPartition, offset: int | None) -> None:
        self.seeks.append((tp, offset))
        if self.rebalance and len(self.seeks) == 1:
            await self.collector._on_revoked({FIRST, SECOND})
            self.collector._on_positioned(dict(STORED))


def _expected(collector: Collector) -> dict[TopicPartition, int | None]:
    return {tp: state.expected for tp, state in collector._partitions.items()}


def _seeks(collector: Collector) -> dict[TopicPartition, int | None]:
    return {tp: state.seek for tp, state in collector._partitions.items() if state.seek_due}


def _collector(rebalance: bool) -> tuple[Collector, RebalancingSource]:
    collector = Collector(CollectorConfig(topic_prefix="t"), sink=object())  # type: ignore[arg-type]
    source = RebalancingSource(collector, rebalance)
    collector.source = source  # type: ignore[assignment]
    collector._on_positioned({FIRST: 60, SECOND: 30})
    collector._partitions[FIRST].seek_to(None)
    collector._partitions[SECOND].seek_to(12)
    return collector, source


@pytest.mark.parametrize("rebalance", [False, True])
def test_queued_seeks_stop_at_a_rebalance(rebalance: bool) -> None:
    collector, source = _collector(rebalance)
    asyncio.run(collector._take({}))
    if rebalance:
        assert source.seeks == [(FIRST, None)]
        assert _expected(collector) == STORED
    else:
        assert source.seeks == [(FIRST, None), (SECOND, 12)]
        assert _expected(collector) == {FIRST: 0, SECOND: 12}
    assert _seeks(collector) == {}

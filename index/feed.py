"""The index's Kafka reader: every partition of the kv-events topic, from given positions.

It joins no consumer group and commits nothing, so any number of index replicas read all
partitions side by side without taking them from each other or from the collector. Each
fetched batch of records is decoded and applied to the `PrefixIndex` in order; records
that cannot be decoded are counted and skipped (the collector stores them as ingest errors).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from kvscope.common.kafka import KafkaSettings
from kvscope.index import metrics
from kvscope.index.state import PrefixIndex
from kvscope.schemas import DecodeError, Envelope, decode

log = logging.getLogger(__name__)

FETCH_WAIT_S = 0.2
"""Longest wait of one fetch: bounds how long a stop or a new partition waits."""
PARTITION_CHECK_S = 10.0
"""How often the topic is asked for partitions it did not have (once it has some: before,
at every fetch wait, so the first records of a new topic arrive without a 10 s delay)."""


class IndexFeed:
    """Reads `topic` from `positions` (partition -> offset; others from the beginning)."""

    def __init__(
        self,
        index: PrefixIndex,
        kafka: KafkaSettings,
        topic: str,
        positions: dict[int, int] | None = None,
        **consumer_options: Any,
    ) -> None:
        self.index = index
        self.topic = topic
        self.positions = dict(positions or {})
        """Per partition: the next offset to apply (advances as records are applied)."""
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **kafka.security_kwargs(),
            **consumer_options,
        )
        self._assigned: set[int] = set()
        self.caught_up = asyncio.Event()
        """Set once every assigned partition was read to its end at least once."""
        self.task: asyncio.Task[None] | None = None
        """The task running `run()`, when its owner started one (`IndexService.feeding`)."""

    async def start(self) -> None:
        """Connect (nothing is left open when no broker answers)."""
        try:
            await self._consumer.start()
        except BaseException:
            await self._consumer.stop()
            raise
        log.info("index reading %s", self.topic)

    async def stop(self) -> None:
        """Close the connection."""
        await self._consumer.stop()

    async def run(self) -> None:
        """Apply records until cancelled."""
        loop = asyncio.get_running_loop()
        next_check = 0.0
        while True:
            if loop.time() >= next_check:
                await self._assign_new_partitions()
                # a topic not there yet is looked for at every fetch wait, then less often
                wait = PARTITION_CHECK_S if self._assigned else FETCH_WAIT_S
                next_check = loop.time() + wait
            if not self._assigned:
                await asyncio.sleep(FETCH_WAIT_S)
                continue
            batches = await self._consumer.getmany(timeout_ms=int(FETCH_WAIT_S * 1000))
            self._apply(batches)
            if not batches and not self.caught_up.is_set():
                self.caught_up.set()

    def _apply(self, batches: dict[TopicPartition, list[Any]]) -> None:
        envelopes: list[Envelope] = []
        for tp, messages in batches.items():
            for message in messages:
                try:
                    envelopes.append(decode(message.value or b""))
                except DecodeError:
                    metrics.UNDECODABLE.inc()
            if messages:
                self.positions[tp.partition] = messages[-1].offset + 1
        if envelopes:
            before = self.index.applied_events
            self.index.apply_all(envelopes)
            metrics.APPLIED_EVENTS.inc(self.index.applied_events - before)
            metrics.RECORDS.inc(len(envelopes))

    async def _assign_new_partitions(self) -> None:
        partitions = await self._partitions()
        new = sorted(p for p in partitions if p not in self._assigned)
        if not new:
            return
        self._assigned.update(new)
        self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(self._assigned)])
        for partition in sorted(self._assigned):
            tp = TopicPartition(self.topic, partition)
            if partition in self.positions:
                self._consumer.seek(tp, self.positions[partition])
            else:
                await self._consumer.seek_to_beginning(tp)
        log.info("index assigned %s partitions %s", self.topic, new)

    async def _partitions(self) -> set[int]:
        # aiokafka's public partitions_for_topic only knows topics it was asked about
        cluster = await self._consumer._client.fetch_all_metadata()
        return set(cluster.partitions_for_topic(self.topic) or ())

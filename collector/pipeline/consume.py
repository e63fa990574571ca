"""Consume stage: an aiokafka consumer-group member that never commits on its own.

Offsets are committed only after the rows are stored (`commit`). On every assignment
the consumer asks its owner where each partition's stored prefix ends and seeks to the
later of that and the committed offset, so a crash between insert and commit neither
loses nor doubles rows. Pausing stops fetching while a partition is being positioned or
the sink is failing; `pause.PauseReasons` tracks why, and a partition resumes only when no
reason is left.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from kvscope.collector.errors import BrokerError
from kvscope.collector.pipeline import metrics
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.pause import POSITIONING, SINK_FAILING, PauseReasons
from kvscope.common.logs import quiet_aiokafka

log = logging.getLogger(__name__)

OnAssigned = Callable[[set[TopicPartition]], Awaitable[dict[TopicPartition, int]]]
"""Called with the new assignment; returns the offset of the last stored record of each
partition that has one: reading resumes there (taken as is, not after the committed one)."""
OnRevoked = Callable[[set[TopicPartition]], Awaitable[None]]
"""Called before partitions go away; must drop (never store) what it buffered for them."""
OnPositioned = Callable[[dict[TopicPartition, int]], None]
"""Called once the assigned partitions are positioned: records before these are stale."""


class _Listener(ConsumerRebalanceListener):
    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if revoked:
            log.info("partitions revoked: %s", _names(revoked))
        self.source.forget_pauses(set(revoked))
        await self.source.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # aiokafka logs a listener's exception and goes on, which would leave the
        # partitions paused and unpositioned for good: the next poll raises it instead
        try:
            await self.source.seek_to_stored(set(assigned))
        except Exception as exc:
            self.source.positioning_failed = exc


def _names(tps: Sequence[TopicPartition] | set[TopicPartition]) -> str:
    return ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in tps)) or "none"


class KafkaSource:
    """One consumer-group member reading the collector's topics."""

    def __init__(
        self,
        config: CollectorConfig,
        on_assigned: OnAssigned,
        on_revoked: OnRevoked,
        on_positioned: OnPositioned,
    ) -> None:
        self.config = config
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_positioned = on_positioned
        self.joined = False
        """True once the first assignment (possibly empty) has been received."""
        self._consumer: AIOKafkaConsumer | None = None
        self._pauses = PauseReasons()
        self.positioning_failed: Exception | None = None
        """Why positioning an assignment failed (raised by the next `poll`)."""

    async def start(self) -> None:
        """Connect and subscribe (the group join completes during the first polls)."""
        cfg = self.config
        quiet_aiokafka()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap_servers,
            group_id=cfg.group,
            client_id=f"kvscope-collector-{cfg.group}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=max(100, cfg.session_timeout_ms // 4),
            max_partition_fetch_bytes=cfg.max_partition_fetch_bytes,
            fetch_max_bytes=cfg.fetch_max_bytes,
            isolation_level="read_committed",
            **(cfg.kafka.security_kwargs() if cfg.kafka is not None else {}),
        )
        try:
            await self._consumer.start()
        except KafkaError as exc:  # e.g. the address answers, but not as a Kafka broker
            await self._consumer.stop()
            self._consumer = None
            raise BrokerError(
                f"Kafka at {cfg.bootstrap_servers} did not answer as a Kafka broker "
                f"({type(exc).__name__}): check --bootstrap-servers and the security settings"
            ) from exc
        self._consumer.subscribe(list(cfg.topics()), listener=_Listener(self))
        log.info(
            "consumer started: group %s, topics %s, brokers %s",
            cfg.group,
            ", ".join(cfg.topics()),
            cfg.bootstrap_servers,
        )

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The running aiokafka consumer."""
        if self._consumer is None:
            raise RuntimeError("KafkaSource.start() was not called")
        return self._consumer

    async def seek_to_stored(self, assigned: set[TopicPartition]) -> None:
        """Position each assigned partition at its last stored offset, else at the commit.

        The last stored record is read again to check that the log still holds it. The
        partitions stay paused meanwhile; every partition is explicitly sought (to the
        beginning when nothing is stored or committed), so records the owner skipped as
        not yet positioned are fetched again.
        """
        self._pause(assigned, POSITIONING)
        last_stored = await self.on_assigned(assigned)
        positions: dict[TopicPartition, int] = {}
        for tp in sorted(assigned):
            committed = await self._committed(tp)
            position = last_stored.get(tp, committed or 0)
            if position:
                self.consumer.seek(tp, position)
            else:
                await self.consumer.seek_to_beginning(tp)
            positions[tp] = position
            log.info(
                "assigned %s[%d]: committed %s, last stored offset %s, resuming at %d",
                tp.topic,
                tp.partition,
                committed,
                last_stored.get(tp, "none"),
                position,
            )
        self.on_positioned(positions)
        self._resume(assigned, POSITIONING)
        self.joined = True

    async def _committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of `tp`, or None when the broker cannot say: the
        stored offsets are what resuming rests on, the commit only a convenience."""
        try:
            return await self.consumer.committed(tp)
        except KafkaError as exc:
            metrics.ERRORS.labels("commit").inc()
            log.warning(
                "%s[%d]: committed offset unavailable, resuming from the stored offsets: %s",
                tp.topic,
                tp.partition,
                exc,
            )
            return None

    async def poll(self, timeout_s: float, max_records: int) -> dict[TopicPartition, list[Any]]:
        """Records fetched since the last poll, per partition (waits up to `timeout_s`);
        raises what made positioning an assignment fail."""
        if self.positioning_failed is not None:
            raise self.positioning_failed
        metrics.LIVENESS.beat()
        return await self.consumer.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )

    async def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Read `tp` again from `offset`, or from its first offset (None: a new log)."""
        if offset is None:
            await self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end offset from the last fetch, when the broker reported one."""
        return self.consumer.highwater(tp)

    def assignment(self) -> set[TopicPartition]:
        """Partitions currently assigned to this member."""
        return set(self.consumer.assignment())

    def pause(self) -> None:
        """Stop fetching every assigned partition while the sink fails."""
        self._pause(self.assignment(), SINK_FAILING)

    def resume(self) -> None:
        """The sink works again: fetch every partition nothing else holds paused."""
        self._resume(self.consumer.paused(), SINK_FAILING)

    def forget_pauses(self, revoked: set[TopicPartition]) -> None:
        """Partitions are being revoked: their pauses go with them."""
        self._pauses.forget(revoked)
        metrics.PAUSED_PARTITIONS.set(len(self._pauses.paused()))

    def _pause(self, partitions: Iterable[TopicPartition], reason: str) -> None:
        self._pauses.add(partitions, reason)
        self.consumer.pause(*self._pauses.paused())
        metrics.PAUSED_PARTITIONS.set(len(self._pauses.paused()))

    def _resume(self, partitions: Iterable[TopicPartition], reason: str) -> None:
        free = self._pauses.remove(partitions, reason)
        if free:
            self.consumer.resume(*free)
        metrics.PAUSED_PARTITIONS.set(len(self._pauses.paused()))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit stored positions; a failure is harmless (resume uses the stored offsets)."""
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
            metrics.COMMITS.inc()
        except KafkaError as exc:
            metrics.ERRORS.labels("commit").inc()
            log.warning("offset commit failed (resume uses stored offsets): %s", exc)

    async def stop(self) -> None:
        """Leave the group and close; safe before start()."""
        if self._consumer is not None:
            self.forget_pauses(self._pauses.paused())
            await self._consumer.stop()
            self._consumer = None
            log.info("consumer stopped")

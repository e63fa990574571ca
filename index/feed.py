"""The index's Kafka reader: every partition of the kv-events topic, from given positions.

It joins no consumer group and commits nothing, so any number of index replicas read all
partitions side by side without taking them from each other or from the collector. Each
fetched chunk of records (at most `max_records`) is decoded and applied to the
`PrefixIndex` in order, and the event loop gets a turn between chunks, so a burst never
holds answers back for long; records that cannot be decoded are counted and skipped (the
collector stores them as ingest errors).

A broker outage of any length is survived: the reader notices it (a failed metadata
probe while idle), closes its consumer, keeps the state and its positions, and reconnects
with jittered backoff; the new consumer seeks to exactly the positions applied so far, so
nothing is missed or applied twice. A broker that came back without its log (offsets start
at 0 again) is recognised there: each partition's record applied last is read again first,
and a partition that holds another record at that offset, or none, is read again from its
first offset (the state skips what it applied already by source epoch and seq), so none of
the new log's records is skipped. `status()` says whether it is connected (since when,
the last error) and caught up with the topic's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from kvscope.common.backoff import Backoff
from kvscope.common.kafka import KafkaSettings, start_or_close
from kvscope.index import metrics
from kvscope.index.health import FeedStatus
from kvscope.index.state import PrefixIndex
from kvscope.schemas import DecodeError, Envelope, decode

log = logging.getLogger(__name__)

FETCH_WAIT_S = 0.2
"""Longest wait of one fetch: bounds how long a stop or a new partition waits."""
PARTITION_CHECK_S = 10.0
"""How often the topic is asked for partitions it did not have (once it has some: before,
at every fetch wait, so the first records of a new topic arrive without a 10 s delay)."""
PROBE_S = 1.0
"""While no records arrive, how often the broker is asked whether it is still there."""
PROBE_TIMEOUT_S = 5.0
"""Longest wait for the broker's answer to a probe or an end-offsets request."""
MAX_RECORDS = 500
"""Records applied between two turns of the event loop (~10 ms of work for hostile records)."""
RECONNECT_INITIAL_S = 0.2
RECONNECT_MAX_S = 10.0
"""Bounds of the jittered backoff between reconnect attempts."""
CONNECTION_ERRORS = (KafkaError, OSError, TimeoutError)
"""What a lost or refused broker raises; anything else is a bug and ends the feed."""


class IndexFeed:
    """Reads `topic` from `positions` (partition -> offset; others from the beginning)."""

    def __init__(
        self,
        index: PrefixIndex,
        kafka: KafkaSettings,
        topic: str,
        positions: dict[int, int] | None = None,
        *,
        backoff: Backoff | None = None,
        max_records: int = MAX_RECORDS,
        **consumer_options: Any,
    ) -> None:
        self.index = index
        self.topic = topic
        self.positions = dict(positions or {})
        """Per partition: the next offset to apply (advances as records are applied)."""
        self.max_records = max_records
        self.backoff = backoff or Backoff(RECONNECT_INITIAL_S, RECONNECT_MAX_S)
        self._kafka = kafka
        self._options = consumer_options
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: set[int] = set()
        self._ends: dict[int, int] = {}
        """Per assigned partition: its end offset when assigned (this connection)."""
        self._starts: dict[int, int] = {}
        """Per assigned partition: the offset its reading began at (this connection)."""
        self._confirmed: set[int] = set()
        """Partitions whose end in `_ends` was checked against a fetch answer's watermark."""
        self._last: dict[int, tuple[int, bytes]] = {}
        """Per partition: offset and value of the record applied last (to know the log again)."""
        self._checks: dict[int, int] = {}
        """Per partition, after a reconnect: the offset read first, whose record must be the
        one applied last there (a broker that lost its log holds another record, or none)."""
        self.caught_up = asyncio.Event()
        """Set while every assigned partition was read to the end it had when the present
        connection began (cleared when the connection is lost)."""
        self.caught_up_once = False
        """Whether the feed ever caught up (the state was current at least once)."""
        self.connected = False
        self.since = time.time()
        """Wall-clock seconds when `connected` last changed."""
        self.last_error = ""
        self.reconnects = 0
        """Connections made after a lost one."""
        self.task: asyncio.Task[None] | None = None
        """The task running `run()`, when its owner started one (`IndexService.feeding`)."""

    def status(self) -> FeedStatus:
        """Connected or not since when, caught up, the last error."""
        return FeedStatus(self.connected, self.caught_up.is_set(), self.since, self.last_error)

    async def start(self) -> None:
        """Connect once (raises when no broker answers; nothing is left open then)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._kafka.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self._kafka.security_kwargs(),
            **self._options,
        )
        await start_or_close(consumer)
        self._consumer, self._assigned, self._checks = consumer, set(), {}
        self._ends, self._starts, self._confirmed = {}, {}, set()
        self._connection(True)
        log.info("index reading %s", self.topic)

    async def stop(self) -> None:
        """Close the connection (the state and positions stay)."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await consumer.stop()
        except asyncio.CancelledError:
            # aiokafka's fetcher, stopped in its retry sleep, leaks its own cancellation:
            # swallowed unless this task really is being cancelled
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
        except CONNECTION_ERRORS as exc:
            log.debug("index consumer closed with %s", exc)

    async def run(self) -> None:
        """Apply records until cancelled, reconnecting after every broker outage."""
        while True:
            _cancelled_if_asked()
            try:
                if self._consumer is None:
                    await self.start()
                await self._read()
            except CONNECTION_ERRORS as exc:
                await self._lost(exc)
                await asyncio.sleep(self.backoff.next_delay())

    async def _read(self) -> None:
        assert self._consumer is not None
        loop = asyncio.get_running_loop()
        next_check = next_probe = 0.0
        while True:
            _cancelled_if_asked()
            if loop.time() >= next_check:
                await self._assign_new_partitions()
                # a topic not there yet is looked for at every fetch wait, then less often
                wait = PARTITION_CHECK_S if self._assigned else FETCH_WAIT_S
                next_check = loop.time() + wait
                next_probe = loop.time() + PROBE_S  # the check asked the broker too
            if not self._assigned:
                await asyncio.sleep(FETCH_WAIT_S)
                continue
            batches = await self._consumer.getmany(
                timeout_ms=int(FETCH_WAIT_S * 1000), max_records=self.max_records
            )
            if batches:
                self._apply(await self._same_log(batches))
            if not self.caught_up.is_set() and self._past_ends():
                self._now_caught_up()
            if batches:
                await asyncio.sleep(0)  # answers and hints get their turn between chunks
            elif not self.caught_up.is_set():
                await self._check_absent()
                if not self._checks and await self._at_end():
                    self._now_caught_up()
                next_probe = loop.time() + PROBE_S
            elif loop.time() >= next_probe:
                await self._partitions()  # raises when the broker is gone
                next_probe = loop.time() + PROBE_S

    def _now_caught_up(self) -> None:
        self.caught_up.set()
        self.caught_up_once = True
        self.backoff.reset()

    def _past_ends(self) -> bool:
        """Whether every partition was read up to its end: the larger of the end asked at
        assignment and the high watermark of the partition's first fetch answer after it
        (the local broker, Tansu, answers the end asked with the last batch's first offset;
        the watermark is right). Saves waiting for an empty fetch and asking the ends again
        (`_at_end`, whose request waits behind the consumer's pending fetch: half a second
        of every restart). False when unsure (no fetch answer yet, a record to check again
        after a reconnect), and the empty fetch decides."""
        if not self._ends or self._checks:
            return False
        assert self._consumer is not None
        for partition in self._ends.keys() - self._confirmed:
            watermark = self._consumer.highwater(TopicPartition(self.topic, partition))
            if watermark is None:
                return False
            self._ends[partition] = max(self._ends[partition], watermark)
            self._confirmed.add(partition)
        return all(self._read_to(p, end) for p, end in self._ends.items())

    def _read_to(self, partition: int, end: int) -> bool:
        """Whether `partition` was read up to `end`: a record at `end - 1` or later was
        applied, or nothing was applied yet and its reading began at exactly `end` (an
        empty partition, or one whose stored position is its end; one that began past its
        end holds a shorter, new log, found by reading it)."""
        start = self._starts.get(partition)
        position = self.positions.get(partition, start)
        if position is None:
            return False
        return position == end if position == start else position >= end

    async def _lost(self, exc: BaseException) -> None:
        """The broker is gone: keep state and positions, close the consumer."""
        name, text = type(exc).__name__, str(exc)
        error = text if text.startswith(name) else f"{name}: {text}" if text else name
        if self.connected:
            log.warning("index lost %s (%s); reconnecting", self.topic, error)
        self.last_error = error
        self._connection(False)
        self.caught_up.clear()
        await self.stop()

    def _connection(self, connected: bool) -> None:
        if connected != self.connected:
            if connected and self.last_error:
                self.reconnects += 1
                metrics.RECONNECTS.inc()
                log.warning("index reconnected to %s", self.topic)
            self.connected, self.since = connected, time.time()
            metrics.CONNECTED.set(int(connected))

    async def _at_end(self) -> bool:
        """Whether every assigned partition was read up to its end (asked now)."""
        assert self._consumer is not None
        partitions = [TopicPartition(self.topic, p) for p in sorted(self._assigned)]
        ends = await _probed(self._consumer.end_offsets(partitions))
        for tp in partitions:
            position = await _probed(self._consumer.position(tp))
            if position < ends[tp]:
                return False
        return True

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
                self._last[tp.partition] = (messages[-1].offset, messages[-1].value or b"")
        if envelopes:
            before = self.index.applied_events
            self.index.apply_all(envelopes)
            metrics.APPLIED_EVENTS.inc(self.index.applied_events - before)
            metrics.RECORDS.inc(len(envelopes))

    async def _same_log(
        self, batches: dict[TopicPartition, list[Any]]
    ) -> dict[TopicPartition, list[Any]]:
        """`batches` less what a lost log would make wrong: a partition's record read again
        to check its log is dropped when it is the one applied (the log is the same), and a
        partition holding another record there is dropped and read from its first offset.
        Records below a partition's position (a Kafka consumer resets an out-of-range
        position to the log's start) are a new log too, applied as they are."""
        kept: dict[TopicPartition, list[Any]] = {}
        for tp, messages in batches.items():
            check = self._checks.pop(tp.partition, None)
            if messages and check is not None:
                first = messages[0]
                if first.offset != check or (first.value or b"") != self._last[tp.partition][1]:
                    await self._new_log(tp, reread=True)
                    continue
                messages = messages[1:]
            elif messages and messages[0].offset < self.positions.get(tp.partition, 0):
                await self._new_log(tp, reread=False)
            kept[tp] = messages
        return kept

    async def _check_absent(self) -> None:
        """Partitions whose checked offset is past the log's end hold a new, shorter log
        (a consumer may wait there without an error)."""
        if not self._checks:
            return
        assert self._consumer is not None
        tps = [TopicPartition(self.topic, p) for p in sorted(self._checks)]
        ends = await _probed(self._consumer.end_offsets(tps))
        for tp in tps:
            if ends[tp] <= self._checks[tp.partition]:
                await self._new_log(tp, reread=True)

    async def _new_log(self, tp: TopicPartition, *, reread: bool) -> None:
        """`tp` holds a new log: one line and a count, then (`reread`) read it from its first
        offset; the state skips records it applied already, by source epoch and seq."""
        applied = self.positions.pop(tp.partition, 0)
        self._last.pop(tp.partition, None)
        self._checks.pop(tp.partition, None)
        self._starts.pop(tp.partition, None)  # read to its end only once records are applied
        metrics.LOG_RESETS.inc()
        log.error(
            "index: %s[%d] no longer holds the records applied up to offset %d (the broker "
            "lost its log, or the topic was recreated); reading it again from its first "
            "offset (see docs/index.md, 'Broker log loss')",
            tp.topic,
            tp.partition,
            applied - 1,
        )
        if reread:
            assert self._consumer is not None
            await self._consumer.seek_to_beginning(tp)

    async def _assign_new_partitions(self) -> None:
        assert self._consumer is not None
        partitions = await self._partitions()
        new = sorted(p for p in partitions if p not in self._assigned)
        if not new:
            return
        self._assigned.update(new)
        tps = [TopicPartition(self.topic, p) for p in sorted(self._assigned)]
        self._consumer.assign(tps)
        # the ends first: asked once a position is known, the request would wait behind
        # the consumer's first fetch, which the broker holds while partitions are empty
        ends = await _probed(self._consumer.end_offsets(tps))
        self._ends = {tp.partition: int(offset) for tp, offset in ends.items()}
        self._confirmed = set()  # assign() began new fetch states: no watermark known yet
        self.caught_up.clear()  # the new partitions are read to their end first
        beginning = []
        for tp in tps:
            if tp.partition in self._last:  # read the record applied last again: same log?
                self._checks[tp.partition] = self._last[tp.partition][0]
                self._consumer.seek(tp, self._checks[tp.partition])
            elif tp.partition in self.positions:
                self._consumer.seek(tp, self.positions[tp.partition])
            else:
                beginning.append(tp)
        if beginning:  # one request for all: the first fetch then asks every partition
            await self._consumer.seek_to_beginning(*beginning)
        for tp in tps:  # known now (seek_to_beginning waited for the reset): no request
            position = self._consumer.position(tp)
            self._starts[tp.partition] = await _probed(position)
        log.info("index assigned %s partitions %s", self.topic, new)

    async def _partitions(self) -> set[int]:
        assert self._consumer is not None
        # aiokafka's public partitions_for_topic only knows topics it was asked about
        client = self._consumer._client
        cluster = await _probed(client.fetch_all_metadata())
        return set(cluster.partitions_for_topic(self.topic) or ())


_T = TypeVar("_T")


async def _probed(awaitable: Awaitable[_T]) -> _T:
    """`awaitable`'s result within `PROBE_TIMEOUT_S` (TimeoutError past it). With
    `asyncio.timeout`, not `asyncio.wait_for`: in Python 3.11 `wait_for` loses a
    cancellation that arrives as the awaited call completes."""
    async with asyncio.timeout(PROBE_TIMEOUT_S):
        return await awaitable


def _cancelled_if_asked() -> None:
    """Raise `CancelledError` when the running task was asked to stop. Python 3.11's
    `asyncio.wait_for` loses a cancellation that arrives as the awaited call completes
    (fixed in 3.12): the feed's loops would then run on, and whoever cancelled it (a
    router shutting down its embedded index) would wait forever. The feed's own waits use
    `asyncio.timeout` (`_probed`); this also covers the `wait_for` calls inside aiokafka."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

"""The collector service: consume -> decode -> columns -> write -> commit, wired together.

`Collector(config).run()` (async) or `.run_sync()` runs one consumer-group member until
`request_stop()` (SIGTERM/SIGINT in the CLI) or `exit_when_idle`. Several collectors
can run in one event loop sharing one `ClickHouseSink` (chDB: one data dir per process).

Batching: records are decoded and turned into columns as they arrive; a flush happens
at `batch_rows` rows or `batch_seconds` after the first buffered record. A flush is a
plan of inserts (`plan_inserts`); the plan runs insert by insert and offsets are
committed once it is done. When an insert fails the partitions are paused (memory
stays at one batch), the failed insert is retried with the same deduplication token
after a backoff with jitter, and fetching resumes once the plan is stored. Sink state
changes are logged once each, not per retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import TopicPartition
from kvscope.collector.errors import SinkError
from kvscope.collector.pipeline import metrics
from kvscope.collector.pipeline.buffer import Buffer, gc_paused, take_bytes
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.consume import KafkaSource
from kvscope.collector.pipeline.continuity import LogContinuity
from kvscope.collector.pipeline.gaps import GapTracker
from kvscope.collector.pipeline.journal import Mark
from kvscope.collector.pipeline.partition import PartitionState
from kvscope.collector.pipeline.plan import MAX_FLUSH_ROWS, Insert, journaled, plan_inserts
from kvscope.collector.pipeline.write import ClickHouseSink, Sink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.tables import (
    KV_BLOCK_EVENTS,
    STREAM_TABLES,
)
from kvscope.common.backoff import Backoff

log = logging.getLogger(__name__)


class Collector:
    """One collector: a consumer-group member storing its partitions exactly once."""

    def __init__(self, config: CollectorConfig, sink: Sink | None = None) -> None:
        self.config = config.validate()
        self._own_sink = sink is None
        self.sink: Sink | None = sink
        self.source = KafkaSource(
            self.config, self._on_assigned, self._on_revoked, self._on_positioned
        )
        self._topics = self.config.topics()
        self._tracker = GapTracker()
        self._continuity = LogContinuity(self._tracker)
        self._partitions: dict[TopicPartition, PartitionState] = {}
        """One state per owned partition (made on assignment, dropped on revoke)."""
        self._buffers: dict[TopicPartition, Buffer] = {}
        """Rows of the next flush per partition, in the order partitions first had some."""
        self._buffered_rows = 0
        self._first_buffered_at: float | None = None
        self._leftover: dict[TopicPartition, list[Any]] = {}
        """Polled records not yet decoded (a flush came due first; see `_add_records`)."""
        self._plan: list[Insert] = []
        self._plan_has_blocks = False
        """The plan stores block events: the residency is stale once it is stored."""
        self._residency_stale = False
        """Block events were committed since the last residency refresh."""
        self._last_refresh = time.monotonic()
        self._plan_commits: dict[TopicPartition, int] = {}
        self._done_marks: list[Mark] = []
        """Done marks of stored flushes, not written yet (they go with the next journal
        insert, or on their own once the collector is quiet)."""
        self._plan_marks: list[Mark] | None = None
        """Done marks the pending plan leaves once stored (None: no plan, or dropped)."""
        self._io_lock = asyncio.Lock()
        self._generation = 0
        self._stop = asyncio.Event()
        self._last_activity = time.monotonic()
        self._sink_failing = False
        self._backoff = Backoff(self.config.retry_initial_s, self.config.retry_max_s)

    @property
    def pending_rows(self) -> int:
        """Rows held in memory: buffered plus planned but not yet stored."""
        return self._buffered_rows + sum(i.rows.num_rows for i in self._plan)

    def request_stop(self) -> None:
        """Ask `run()` to flush, commit and return (safe from signal handlers)."""
        self._stop.set()

    def run_sync(self) -> None:
        """Run in a fresh event loop until stopped."""
        asyncio.run(self.run())

    async def run(self) -> None:
        """Consume, store and commit until `request_stop()` or idle timeout."""
        if self.sink is None:
            self.sink = await self._open_sink()
        await self.source.start()
        try:
            await self._loop()
        finally:
            await self._shutdown()

    async def _open_sink(self) -> ClickHouseSink:
        target, cluster = self.config.target, self.config.cluster
        sink = await asyncio.to_thread(ClickHouseSink.open, target, cluster)
        await asyncio.to_thread(migrate, sink.client, target, cluster)
        return sink

    # ---- rebalance hooks -------------------------------------------------

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Drop everything not yet stored (the next owner resumes from stored offsets).

        The new assignment starts unpaused, so a sink that is still failing will pause
        it again on the next failed insert.
        """
        async with self._io_lock:
            self._generation += 1
            self._drop_pending()
            self._sink_failing = False
            gone = {(tp.topic, tp.partition) for tp in revoked}
            self._done_marks = [m for m in self._done_marks if (m[0], m[1]) not in gone]
            for tp in revoked:
                self._tracker.forget(tp.topic, tp.partition)
                self._partitions.pop(tp, None)
                self._continuity.forget(tp)

    def _state(self, tp: TopicPartition) -> PartitionState:
        """The state of partition `tp` (a fresh one the first time)."""
        state = self._partitions.get(tp)
        if state is None:
            state = self._partitions[tp] = PartitionState()
        return state

    def _on_positioned(self, positions: dict[TopicPartition, int]) -> None:
        """Accept records of these partitions from their resume positions on."""
        for tp, offset in positions.items():
            self._state(tp).expected = offset

    async def _on_assigned(self, assigned: set[TopicPartition]) -> dict[TopicPartition, int]:
        """Look up the seq state and batch to re-read of every assigned partition, and the
        offset of its last stored record (where reading resumes, to check the log holds it)."""
        assert self.sink is not None
        by_topic: dict[str, list[int]] = {}
        for tp in assigned:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        stored: dict[TopicPartition, int] = {}
        backoff = Backoff(self.config.retry_initial_s, self.config.retry_max_s)
        for topic, partitions in by_topic.items():
            table = STREAM_TABLES[self._topics[topic]]
            while True:
                try:
                    async with self._io_lock:
                        state = await asyncio.to_thread(
                            self.sink.resume_state, topic, table, partitions
                        )
                    break
                except SinkError as exc:
                    self._sink_state(failing=True, error=exc)
                    if self._stop.is_set() or not exc.retriable:
                        raise
                    await asyncio.sleep(backoff.next_delay())
            self._sink_state(failing=False)
            for partition in partitions:
                tp = TopicPartition(topic, partition)
                self._tracker.restore(topic, partition, state.seqs.get(partition, []))
                last = state.last.get(partition)
                replay = state.replays.get(partition)
                self._state(tp).restore(tp, state.journal.get(partition, 0), last, replay)
                if last is not None:
                    stored[tp] = last.offset
        self._last_activity = time.monotonic()
        return stored

    # ---- main loop -------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stop.is_set():
            if self._plan:
                if not await self._run_plan():
                    await self._wait_paused(self._backoff.next_delay())
                    continue
                await self._commit_plan()
            timeout = 0.2
            if self._first_buffered_at is not None:
                due = self._first_buffered_at + self.config.batch_seconds - time.monotonic()
                timeout = max(0.0, min(timeout, due))
            data = {}
            if not self._leftover:
                data = await self.source.poll(timeout, self.config.max_poll_records)
            if data or self._leftover:
                self._last_activity = time.monotonic()
                await self._take(data)
            elif self._quiet_with_stale_residency():
                await self._refresh_residency()
            elif self._done_marks and self._quiet_for(self.config.batch_seconds):
                self._plan_done_marks()
            if self._flush_due():
                self._make_plan()
            if self._idle():
                log.info("no records for %.1f s: stopping", self.config.exit_when_idle)
                break

    def _quiet_for(self, seconds: float) -> bool:
        """Nothing buffered, planned or left over, and nothing polled for `seconds`."""
        return (
            not self._plan
            and not self._buffers
            and not self._leftover
            and time.monotonic() - self._last_activity >= seconds
        )

    def _quiet_with_stale_residency(self) -> bool:
        """Quiet for a batch interval while the residency lags what was stored: a good
        moment to refresh it."""
        return self._residency_stale and self._quiet_for(self.config.batch_seconds)

    def _idle(self) -> bool:
        idle_s = self.config.exit_when_idle
        return idle_s is not None and self.source.joined and self._quiet_for(idle_s)

    def _flush_due(self) -> bool:
        if self._first_buffered_at is None:
            return False
        return (
            self._buffered_rows >= self.config.batch_rows
            or time.monotonic() - self._first_buffered_at >= self.config.batch_seconds
        )

    async def _take(self, data: dict[TopicPartition, list[Any]]) -> None:
        """`_add` the records, then seek the partitions that must be read again.

        A seek to the first offset waits for the broker, and a rebalance can come in
        meanwhile: the seeks left then belong to the revoked assignment (the new one is
        positioned from the stored offsets), so none of them is applied any more.
        """
        self._add(data)
        generation = self._generation
        seeks = []
        for tp, state in sorted(self._partitions.items()):
            if state.seek_due:
                seeks.append((tp, state.seek))
                state.seek_due, state.seek = False, None
        for tp, offset in seeks:
            self._leftover.pop(tp, None)
            await self.source.seek(tp, offset)
            if self._generation != generation:
                return
            self._state(tp).expected = offset or 0

    def _add(self, data: dict[TopicPartition, list[Any]]) -> None:
        """Decode, detect gaps and build columns for polled records (queued behind leftovers)."""
        for tp, records in data.items():
            self._leftover.setdefault(tp, []).extend(records)
        with gc_paused():
            self._add_records()
        if self._buffers and self._first_buffered_at is None:
            self._first_buffered_at = time.monotonic()
        metrics.BUFFERED_ROWS.set(self._buffered_rows)

    def _add_records(self) -> None:
        """Take queued records into the buffers until a flush is due; the rest stays queued.

        Records go in chunks of at most as many bytes as rows are left below `MAX_FLUSH_ROWS`:
        a record's rows never outnumber its bytes (a tombstone counts one), so a flush holds
        at most `MAX_INSERT_ROWS` rows (one insert stays one block) whatever a poll brings,
        and memory stays bounded. Taking stops once `batch_rows` rows are buffered.
        """
        while self._leftover and self._buffered_rows < self.config.batch_rows:
            tp = next(iter(self._leftover))
            records = self._leftover.pop(tp)
            state = self._partitions.get(tp)
            if state is None or state.expected is None:
                continue
            if records and records[0].offset < state.expected:
                self._new_log(tp, state.expected, records[0].offset)
            check, state.check = state.check, None
            replay, state.replay_after_check = state.replay_after_check, None
            if check is not None and records and records[0].offset == check.offset:
                if not check.matches(records[0].value):
                    self._new_log(tp, check.offset + 1, None)
                    continue
                self._continuity.forget(tp)
                if replay is not None:
                    state.replay = replay
                    state.seek_to(replay.first_offset)
                    continue
                state.expected = check.offset + 1
                records = records[1:]
            elif replay is not None:  # the checked offset is gone from the log (retention)
                state.replay = replay
            if not records:
                continue
            if state.replay is None:
                due = self._continuity.check_before(tp, records[0], state.expected)
                if due is not None:
                    state.check = due
                    state.seek_to(due.offset)
                    continue
            last = records[-1]
            records = self._skip_stored(state, records)
            while records and self._buffered_rows < self.config.batch_rows:
                chunk, records = take_bytes(records, MAX_FLUSH_ROWS - self._buffered_rows)
                self._add_partition(tp, chunk)
                state.expected = chunk[-1].offset + 1
                self._continuity.took(tp, chunk[-1])
            if records:
                self._leftover = {tp: records, **self._leftover}
            else:
                state.expected = last.offset + 1
                self._continuity.took(tp, last)
            highwater = self.source.highwater(tp)
            if highwater is not None:
                lag = max(0, highwater - state.expected)
                metrics.LAG.labels(tp.topic, str(tp.partition)).set(lag)

    def _new_log(self, tp: TopicPartition, expected: int, offset: int | None) -> None:
        """The partition holds a new log (offsets restarted): store its records, skip none.

        Either the consumer's position moved back without a seek of ours (aiokafka drops
        fetched records not at its position, and every seek of the collector also sets
        the partition's `expected`: Kafka reset it after an out-of-range fetch), or the
        record at the last stored offset is not the one stored (`offset` None: read the
        log from its start).
        A loss found again at the same stored offset (by the other detection) is not
        reported again.
        """
        if self._continuity.first_report(tp, expected - 1):
            metrics.ERRORS.labels("offset_reset").inc()
            log.error(
                "%s[%d]: the log does not hold the records stored up to offset %d (the "
                "broker lost it, or the topic was recreated); storing the new log's records "
                "from %s (see docs/collector.md, 'Broker log loss')",
                tp.topic,
                tp.partition,
                expected - 1,
                "its first offset" if offset is None else f"offset {offset}",
            )
        state = self._state(tp)
        state.replay = state.replay_after_check = None
        self._continuity.forget(tp)
        if offset is None:
            state.seek_to(None)
        else:
            state.expected = offset

    def _skip_stored(self, state: PartitionState, records: list[Any]) -> list[Any]:
        """While re-reading a noted batch, drop the records that already have their rows."""
        replay = state.replay
        if replay is None:
            return records
        if records[-1].offset + 1 >= replay.next_offset:
            state.replay = None
        return [r for r in records if r.offset not in replay.stored]

    def _add_partition(self, tp: TopicPartition, records: list[Any]) -> None:
        metrics.RECORDS_CONSUMED.labels(tp.topic).inc(len(records))
        buffer = self._buffers.setdefault(tp, Buffer())
        buffer.take(self._topics[tp.topic], tp, records, self._tracker)
        self._buffered_rows = sum(b.rows for b in self._buffers.values())

    def _make_plan(self) -> None:
        batches = [buffer.batch(tp) for tp, buffer in self._buffers.items()]
        self._plan = plan_inserts(batches)
        if self.config.cluster is None:
            flush = self._next_flush(list(self._buffers))
            self._plan, self._plan_marks = journaled(self._plan, flush, self._done_marks)
        self._plan_has_blocks = any(i.table == KV_BLOCK_EVENTS.name for i in self._plan)
        self._plan_commits = {TopicPartition(b.topic, b.partition): b.next_offset for b in batches}
        metrics.BATCH_ROWS.observe(self._buffered_rows)
        self._buffers.clear()
        self._buffered_rows = 0
        self._first_buffered_at = None
        metrics.BUFFERED_ROWS.set(0)

    def _next_flush(self, partitions: list[TopicPartition]) -> int:
        """A flush id (wall-clock microseconds) above every journal version of `partitions`:
        the journal keeps each partition's highest version, even across owners whose
        clocks disagree."""
        floor = max((self._state(tp).journal // 2 for tp in partitions), default=0)
        flush = max(time.time_ns() // 1000, floor + 1)
        for tp in partitions:
            self._state(tp).journal = 2 * flush + 1
        return flush

    def _plan_done_marks(self) -> None:
        """A plan of just the journal insert writing the pending done marks."""
        self._plan, self._plan_marks = journaled([], 0, self._done_marks)
        self._plan_commits = {}

    def _drop_pending(self) -> None:
        self._leftover.clear()
        self._plan = []
        self._plan_marks = None
        self._plan_commits = {}
        self._buffers.clear()
        self._buffered_rows = 0
        self._first_buffered_at = None
        metrics.BUFFERED_ROWS.set(0)

    async def _run_plan(self) -> bool:
        """Run the pending inserts in order; False (plan kept) when the sink fails."""
        assert self.sink is not None
        generation = self._generation
        while self._plan:
            async with self._io_lock:
                if generation != self._generation:
                    return True
                insert = self._plan[0]
                try:
                    await asyncio.to_thread(self.sink.insert, insert)
                except SinkError as exc:
                    metrics.ERRORS.labels("sink").inc()
                    if not exc.retriable:
                        raise
                    self._sink_state(failing=True, error=exc)
                    return False
                self._plan.pop(0)
        self._sink_state(failing=False)
        self._backoff.reset()
        return True

    async def _commit_plan(self) -> None:
        if self._plan_marks is not None:
            self._done_marks, self._plan_marks = self._plan_marks, None
        commits, self._plan_commits = self._plan_commits, {}
        await self.source.commit(commits)
        if self._plan_has_blocks and self.config.residency and self.config.cluster is None:
            self._plan_has_blocks = False
            self._residency_stale = True
        due = self._last_refresh + self.config.residency_interval_s
        if self._residency_stale and time.monotonic() >= due:
            await self._refresh_residency()

    async def _refresh_residency(self) -> None:
        """Derive the residency of what was stored since the last refresh (at most every
        `residency_interval_s` while events arrive, and when the collector goes quiet or
        stops); a failure waits for the next chance (the raw rows are stored and
        committed; the next refresh picks them up)."""
        refresh = getattr(self.sink, "refresh_residency", None)
        self._last_refresh = time.monotonic()
        if refresh is None:
            self._residency_stale = False
            return
        try:
            async with self._io_lock:
                await asyncio.to_thread(refresh)
            self._residency_stale = False
        except SinkError as exc:
            metrics.ERRORS.labels("sink").inc()
            log.warning("%s (retried later)", exc)

    def _sink_state(self, failing: bool, error: Exception | None = None) -> None:
        """Log sink transitions once, pause/resume fetching with them."""
        if failing == self._sink_failing:
            return
        self._sink_failing = failing
        if failing:
            log.warning("ClickHouse sink failing, pausing partitions and retrying: %s", error)
            self.source.pause()
        else:
            log.info("ClickHouse sink recovered, resuming partitions")
            self.source.resume()

    async def _wait_paused(self, delay: float) -> None:
        """Back off while paused, still polling so the group keeps this member."""
        deadline = time.monotonic() + delay
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            data = await self.source.poll(min(remaining, 0.2), self.config.max_poll_records)
            if data:
                await self._take(data)

    async def _shutdown(self) -> None:
        """Flush and commit what is buffered (bounded by shutdown_timeout_s), then leave."""
        try:
            if self._buffers:
                self._make_plan()
            deadline = time.monotonic() + self.config.shutdown_timeout_s
            while self._plan and time.monotonic() < deadline:
                if await self._run_plan():
                    await self._commit_plan()
                else:
                    await asyncio.sleep(self._backoff.next_delay())
            if not self._plan and self._done_marks:
                self._plan_done_marks()
                if await self._run_plan():
                    await self._commit_plan()
            if self._plan:
                log.warning("stopping with %d unstored inserts (not committed)", len(self._plan))
            elif self._residency_stale:
                await self._refresh_residency()
        finally:
            await self.source.stop()
            if self._own_sink and isinstance(self.sink, ClickHouseSink):
                await asyncio.to_thread(self.sink.close)
            log.info("collector stopped")

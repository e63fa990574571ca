"""The sender thread of a `KafkaPublisher`: its own asyncio loop and aiokafka producer.

It sleeps until there is work: the first record after a quiet spell wakes it (the
queue calls `wake()`), then it lingers `linger_ms` so a batch gathers, drains the
queue, encodes envelopes, packs them into one record batch per (topic, partition) and
hands those to aiokafka; while records keep coming it wakes once per linger, and a
full batch (a quarter of the queue) cuts the linger short. An idle engine never wakes
it. Failures never escape: records that cannot be delivered are added to the loss
ledger, and pending losses go out as `Gap` records when the broker answers again (one
probe per second while it does not). Should the loop itself fail, `run_forever`
reports the records in flight as lost, counts a restart, and runs a fresh loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from kvscope.common.backoff import Backoff
from kvscope.publisher.queue import RecordQueue
from kvscope.publisher.records import Member, RecordEncoder

if TYPE_CHECKING:
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.metrics import PublisherMetrics

log = logging.getLogger(__name__)

_RECONNECT_INITIAL_S = 0.1
_PARTITIONS_TTL_S = 30.0
_MAX_DRAIN = 50_000
_RESTART_MAX_S = 5.0
_CALL_POLL_S = 0.05
"""How often a waiting `call` checks that the loop it queued on is still there."""


@dataclass
class _Batch:
    """A record batch being filled for one (topic, partition)."""

    builder: Any
    stream: str
    members: list[Member] = field(default_factory=list)
    oldest: float = 0.0


class KeyPartitioner:
    """aiokafka's default partitioner on the record key (what `send(key=...)` picks),
    remembered per (key, partition count): one murmur2 per source, not per record."""

    def __init__(self) -> None:
        self._partitioner = DefaultPartitioner()
        self._index: dict[tuple[bytes, int], int] = {}

    def __call__(self, partitions: list[int], key: bytes) -> int:
        """The partition of `key` among `partitions` (the topic's, sorted)."""
        index = self._index.get((key, len(partitions)))
        if index is None:
            index = self._partitioner(key, list(range(len(partitions))), None)
            self._index[(key, len(partitions))] = index
        return partitions[index]


def producer_kwargs(config: PublisherConfig) -> dict[str, Any]:
    """aiokafka producer arguments for a config (security settings passed through)."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id,
        "acks": "all" if config.acks == "all" else int(config.acks),
        "compression_type": None if config.compression == "none" else config.compression,
        "max_request_size": config.max_request_size,
        "max_batch_size": config.max_batch_bytes,
        "linger_ms": 0,  # batches are built here and sent when due: no second linger
        "request_timeout_ms": int(config.delivery_timeout_s * 1000),
        "enable_idempotence": False,
        **config.security_kwargs(),
    }
    return kwargs


class Sender:
    """Owns the event loop, the producer and every in-flight batch of one `KafkaPublisher`.

    It is given its collaborators: the `RecordQueue` it drains (and reports losses to),
    the metrics it counts deliveries and errors in, and `topic`, which names the Kafka
    topic of a stream.
    """

    def __init__(
        self,
        config: PublisherConfig,
        *,
        queue: RecordQueue,
        metrics: PublisherMetrics,
        topic: Callable[[str], str],
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._topic = topic
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = asyncio.Event()
        self._stop_requested: asyncio.Event | None = asyncio.Event()
        self._stopping = False
        self._producer: AIOKafkaProducer | None = None
        self._inflight: dict[int, list[Member]] = {}
        self._in_round = False
        self._idle = False
        self.rounds = 0
        """Send rounds so far (each one a wake of this thread); tests and debugging read it."""
        self._records = RecordEncoder(config, queue=queue, metrics=metrics)
        self._partitions: dict[str, list[int]] = {}
        self._partitions_at: dict[str, float] = {}
        self._lookup_failed: dict[str, BaseException] = {}
        self._partition = KeyPartitioner()

    def run_forever(self) -> None:
        """Thread body: run the loop until `stop()`; a failed loop is replaced, never fatal."""
        backoff = Backoff(_RECONNECT_INITIAL_S, _RESTART_MAX_S)
        while True:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._main())
                return
            except Exception as exc:
                log.error("kvscope sender loop failed; restarting it", exc_info=True)
                self._metrics.note_error("sender_loop", exc)
                self._metrics.sender_restarts.inc()
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(self._close_producer())
                with contextlib.suppress(Exception):
                    self._cancel_pending()
            finally:
                self._loop.close()
            self._abandon_inflight()
            if self._stopping:
                return
            # The next loop exists before the pause, so flush() and stop() can queue on it.
            self._loop = asyncio.new_event_loop()
            self._wake, self._stop_requested = asyncio.Event(), asyncio.Event()
            time.sleep(backoff.next_delay())

    def _cancel_pending(self) -> None:
        """Cancel what is still queued on the failed loop before it closes (a flush or stop
        that a `call` waits on: the call then goes to the next loop)."""
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def wake(self) -> None:
        """Wake the loop from any thread (the queue calls it; a no-op once it is closed)."""
        loop, wake = self._loop, self._wake
        if wake is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(wake.set)

    def _abandon_inflight(self) -> None:
        """After the loop failed: batches it had in flight will never be acknowledged."""
        inflight, self._inflight = self._inflight, {}
        for members in inflight.values():
            self._records.fail(members, "send_failed")
        self._in_round = False
        self._producer = None

    def call(self, make: Callable[[], Coroutine[Any, Any, Any]], timeout_s: float) -> Any:
        """Run `make()` on the sender loop from another thread; None if it missed the deadline.

        A loop that fails closes with what was queued on it never run: a call waiting on
        it then goes to the loop that replaces it (`make` again: flush and stop may run
        twice), and waits while the next loop is being made. Once stopped: None at once.
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            loop = self._loop
            if not loop.is_closed():
                coro = make()
                try:
                    future = asyncio.run_coroutine_threadsafe(coro, loop)
                except RuntimeError:
                    coro.close()
                else:
                    done, result = self._wait(future, loop, deadline)
                    if done:
                        return result
            if self._stopping or time.monotonic() >= deadline:
                return None
            time.sleep(_CALL_POLL_S)

    def flush_within(self, timeout_s: float) -> bool:
        """From another thread: deliver what is queued; False if `timeout_s` passed first."""
        return self.call(self.flush, timeout_s) is True

    def stop_within(self, timeout_s: float) -> None:
        """From another thread: stop the loop within `timeout_s` (what it holds is lost)."""
        self.call(self.stop, timeout_s)

    def _wait(
        self, future: Any, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> tuple[bool, Any]:
        """(True, result) when `future` settles by `deadline` (result None if it missed
        it or failed); (False, None) when its loop failed before running it to the end."""
        while True:
            try:
                return True, future.result(max(0.0, min(deadline - time.monotonic(), _CALL_POLL_S)))
            except FutureCancelled:
                return False, None  # the failed loop cancelled it (our own cancel returns)
            except (FutureTimeout, TimeoutError):
                if loop.is_closed() and not future.done():
                    return False, None
                if time.monotonic() >= deadline:
                    future.cancel()
                    return True, None
            except Exception:
                self._metrics.note_error("control")
                return True, None

    async def _main(self) -> None:
        self._idle = False
        backoff = Backoff(_RECONNECT_INITIAL_S, self._config.reconnect_backoff_max_s)
        while not self._stopping:
            producer = AIOKafkaProducer(**producer_kwargs(self._config))
            try:
                await producer.start()
            except Exception as exc:
                self._metrics.note_error("connect", exc)
                await _close_quietly(producer)
                self._expire_queued()
                await self._backoff(_reconnect_delay(backoff, exc))
                continue
            log.info("kvscope publisher connected to %s", self._config.bootstrap_servers)
            self._producer = producer
            backoff.reset()
            await self._pump(producer)
        await self._close_producer()

    async def _backoff(self, seconds: float) -> None:
        """Wait before the next connection attempt; only `stop()` cuts it short (not flush)."""
        assert self._stop_requested is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), seconds)

    async def _sleep(self, seconds: float) -> None:
        """The pump's linger; a full batch, `flush()` and `stop()` cut it short."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def _idle_until_work(self) -> None:
        """After a round that found nothing: sleep until a record (or flush, stop) wakes us."""
        assert self._wake is not None
        queue = self._queue
        queue.armed = True
        if not queue and not len(queue.losses) and not self._stopping:
            await self._wake.wait()
        queue.armed = False
        self._wake.clear()

    async def _pump(self, producer: AIOKafkaProducer) -> None:
        linger = self._config.linger_ms / 1000
        while not self._stopping:
            if self._idle:
                await self._idle_until_work()
            await self._sleep(linger)
            self.rounds += 1
            self._in_round = True
            try:
                self._idle = not await self._send_round(producer)
            except Exception:
                self._metrics.note_error("send")
                await asyncio.sleep(0.1)
            finally:
                self._in_round = False

    async def _send_round(self, producer: AIOKafkaProducer) -> bool:
        """Send pending Gaps and everything queued right now; False if there was nothing."""
        batches: dict[tuple[str, int], _Batch] = {}
        full: list[tuple[str, int, _Batch]] = []
        self._expire_partitions()
        try:
            records = self._records
            gaps = records.gaps_due()
            now = time.monotonic()
            for lost in gaps:
                await self._add(producer, batches, full, records.gap(lost), now)
            queue = self._queue
            drained = min(len(queue), _MAX_DRAIN)
            for _ in range(drained):
                item = queue.pop()
                await self._add(producer, batches, full, records.item(item), item.enqueued)
            for topic, partition, batch in full:  # each before its partition's open batch
                await self._submit(producer, topic, partition, batch)
            for (topic, partition), batch in batches.items():
                await self._submit(producer, topic, partition, batch)
            return bool(gaps or drained or len(queue.losses))
        except BaseException:
            never_sent = [batch for _, _, batch in full] + list(batches.values())
            for batch in never_sent:  # never submitted: report, do not lose silently
                self._records.fail(batch.members, "send_failed")
                batch.members = []
            raise

    async def _add(
        self,
        producer: AIOKafkaProducer,
        batches: dict[tuple[str, int], _Batch],
        full: list[tuple[str, int, _Batch]],
        record: tuple[Member, bytes] | None,
        enqueued: float,
    ) -> None:
        """Batch one encoded record (None: lost on the way, nothing to do). Awaits only
        for the rare partition lookup; the per-record work is `_append`'s plain call."""
        if record is None:
            return
        member, value = record
        while not self._append(producer, batches, full, member, value, enqueued):
            await self._refresh_partitions(producer, self._topic(member.stream))

    def _append(
        self,
        producer: AIOKafkaProducer,
        batches: dict[tuple[str, int], _Batch],
        full: list[tuple[str, int, _Batch]],
        member: Member,
        value: bytes,
        enqueued: float,
    ) -> bool:
        """Add one record to its partition's open batch; a batch that fills goes to `full`.
        False (nothing done) if the topic's partitions must be looked up first."""
        topic = self._topic(member.stream)
        partitions = self._partitions.get(topic)
        if partitions is None:
            failed = self._lookup_failed.get(topic)
            if failed is None:
                return False
            self._records.fail([member], loss_reason(failed))
            return True
        source = member.source
        partition = self._partition(partitions, source.key)
        batch = batches.get((topic, partition))
        if batch is None:
            batch = batches[(topic, partition)] = _Batch(producer.create_batch(), member.stream)
            batch.oldest = enqueued
        if batch.builder.append(key=source.key, value=value, timestamp=None) is None:
            full.append((topic, partition, batch))
            batch = batches[(topic, partition)] = _Batch(producer.create_batch(), member.stream)
            batch.oldest = enqueued
            batch.builder.append(key=source.key, value=value, timestamp=None)
        batch.members.append(member)
        return True

    def _expire_partitions(self) -> None:
        """At a round's start: forget partition lists past their time to live, and the
        previous round's failed lookups (this round looks again)."""
        self._lookup_failed.clear()
        limit = time.monotonic() - _PARTITIONS_TTL_S
        for topic in [t for t, looked_up in self._partitions_at.items() if looked_up < limit]:
            del self._partitions[topic], self._partitions_at[topic]

    async def _refresh_partitions(self, producer: AIOKafkaProducer, topic: str) -> None:
        """Look up `topic`'s partitions; a failed lookup fails this round's records of
        that topic (the next round looks again)."""
        try:
            partitions = sorted(await producer.partitions_for(topic))
        except Exception as exc:
            self._records.healthy = False
            self._metrics.note_error("metadata", exc)
            self._lookup_failed[topic] = exc
            return
        self._partitions[topic] = partitions
        self._partitions_at[topic] = time.monotonic()

    async def _submit(
        self, producer: AIOKafkaProducer, topic: str, partition: int, batch: _Batch
    ) -> None:
        if not batch.members:
            return
        try:
            future = await producer.send_batch(batch.builder, topic, partition=partition)
        except Exception as exc:
            self._records.healthy = False
            self._metrics.note_error("send", exc)
            self._records.fail(batch.members, loss_reason(exc))
            batch.members = []
            return
        members = batch.members
        batch.members = []
        self._inflight[id(members)] = members
        oldest = batch.oldest
        future.add_done_callback(lambda f: self._delivered(f, batch.stream, members, oldest))

    def _delivered(
        self, future: asyncio.Future[Any], stream: str, members: list[Member], oldest: float
    ) -> None:
        if self._inflight.pop(id(members), None) is None:
            return  # already reported lost when a failed loop was abandoned
        if future.cancelled() or future.exception() is not None:
            exc = None if future.cancelled() else future.exception()
            self._records.healthy = False
            self._metrics.note_error("delivery", exc)
            self._records.fail(members, loss_reason(exc))
            return
        self._records.healthy = True
        self._records.delivered(stream, len(members))
        self._metrics.send_latency.observe(time.monotonic() - oldest)

    def _expire_queued(self) -> None:
        """While no broker answers, drop queued records older than the delivery timeout."""
        limit = time.monotonic() - self._config.delivery_timeout_s
        self._queue.expire(limit, "broker_unavailable")

    async def flush(self) -> bool:
        """Send everything queued and wait until it is acknowledged (or lost)."""
        assert self._wake is not None
        while (
            self._queue
            or self._inflight
            or self._in_round
            or (len(self._queue.losses) and self._records.healthy)
        ):
            self._wake.set()
            await asyncio.sleep(0.002)
        if self._producer is not None:
            await self._producer.flush()
        return not self._queue and not len(self._queue.losses)

    async def stop(self) -> None:
        """Stop the pump and close the producer (what it still holds is lost)."""
        self._stopping = True
        if self._wake is not None and self._stop_requested is not None:
            self._wake.set()
            self._stop_requested.set()

    async def _close_producer(self) -> None:
        if self._producer is not None:
            await _close_quietly(self._producer)
            self._producer = None


def _reconnect_delay(backoff: Backoff, exc: BaseException) -> float:
    """How long to wait after a failed connect: the next jittered delay if the error is
    retriable, else the maximum, as only an operator can fix it (the publisher keeps
    trying and never raises)."""
    if _retriable(exc):
        delay = backoff.next_delay()
        log.info("kafka not reachable (%s); retrying in %.1fs", type(exc).__name__, delay)
        return delay
    log.warning(
        "kafka refused the connection (%s, not retriable: check the brokers and the "
        "security settings); retrying in %.1fs",
        type(exc).__name__,
        backoff.maximum_s,
    )
    return backoff.maximum_s


def _retriable(exc: BaseException) -> bool:
    """Whether the broker may take a retry: it timed out or the connection broke, or the
    error itself says `retriable` (aiokafka's and kvscope's errors carry that attribute)."""
    return isinstance(exc, KafkaTimeoutError | KafkaConnectionError) or bool(
        getattr(exc, "retriable", False)
    )


def loss_reason(exc: BaseException | None) -> str:
    """Why a batch was lost: the broker did not answer in time (retriable) or refused it."""
    if exc is None or _retriable(exc):
        return "broker_unavailable"
    return "send_failed"


async def _close_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), 2.0)
    except Exception:
        log.debug("producer stop failed", exc_info=True)

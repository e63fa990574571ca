"""The relay: a ZMQ ROUTER that engines send `RelayBatch`es to, and one aiokafka producer.

Each batch's records are produced in order, verbatim (topic, key, value), with aiokafka's
default partitioner on the key (the partition the in-process sender would pick), in
record batches built here per partition, as the in-process sender builds them. Once Kafka
acknowledged or failed every record of a batch, the relay sends the engine a `RelayAck`
naming the records lost and why (`broker_unavailable` when the broker did not answer
within `delivery_timeout_s`, `send_failed` when it refused). A batch that would take the
records in flight past `max_inflight_records` is refused at once (`relay_full`), and once
the first attempt to reach the brokers failed, until one answers, every batch is
(`broker_unavailable`; batches wait for that first attempt): the engine
side books those losses and reports them as Gaps, so the relay never holds more than its
bound and never blocks an engine.

On SIGTERM it stops taking batches, produces and acks what it holds (within
`delivery_timeout_s`), and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import Counter
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from aiokafka import AIOKafkaProducer
from kvscope.common.backoff import Backoff
from kvscope.common.kafka import start_or_close
from kvscope.common.logs import quiet_aiokafka, throttle
from kvscope.publisher.relay import metrics
from kvscope.publisher.relay.config import RelayConfig
from kvscope.publisher.relay_client import RelayAck, RelayBatch, RelayLoss, RelayRecord
from kvscope.publisher.sender import KeyPartitioner, loss_reason, producer_kwargs
from kvscope.schemas import ConfigError

log = logging.getLogger(__name__)

_RECONNECT_INITIAL_S = 0.1
_DRAIN_MARGIN_S = 5.0
_CLOSE_LINGER_MS = 1000
"""How long closing the socket may take to hand the last acks to the engines."""

_Result = asyncio.Future[Any] | str
"""A produced record's delivery future, or why it was lost before Kafka saw it."""


class Relay:
    """One relay process's state: the bound socket, the producer (once connected), the
    batches waiting to be produced and the acks waiting for Kafka."""

    def __init__(self, config: RelayConfig) -> None:
        self._config = config.validate()
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._producer: AIOKafkaProducer | None = None
        self._batches: asyncio.Queue[tuple[bytes, RelayBatch]] = asyncio.Queue()
        self._acks: set[asyncio.Task[None]] = set()
        self._inflight = 0
        self._partition = KeyPartitioner()
        self._tried = asyncio.Event()
        """Set once the first connection attempt ended: until then batches wait for it."""
        self._decoder = msgspec.msgpack.Decoder(RelayBatch)
        self._encoder = msgspec.msgpack.Encoder()

    def bind(self) -> None:
        """Bind the listen address; `ConfigError` (one line) when it cannot be bound."""
        self._socket.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
        try:
            self._socket.bind(self._config.listen)
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(
                f"cannot listen on {self._config.listen} ({exc.strerror}); choose another "
                "--listen or stop the process that holds it"
            ) from None
        log.info("kvscope relay listening on %s", self._config.listen)

    def close(self) -> None:
        """Close the socket (acks already queued get `_CLOSE_LINGER_MS` to leave)."""
        self._socket.close()
        self._context.term()

    async def run_until_signal(self) -> None:
        """Relay until SIGTERM or SIGINT, then drain and close."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await self.run(stop)

    async def run(self, stop: asyncio.Event) -> None:
        """Take batches until `stop` is set, then produce and ack what is held, and close.

        While no broker answers, aiokafka's and the relay's repeated lines are throttled
        (one per minute each); the losses are counted in /metrics."""
        quiet_aiokafka()
        throttle((__name__,))
        connect = asyncio.create_task(self._connect(stop))
        produce = asyncio.create_task(self._produce())
        try:
            await self._receive(stop)
            log.info("kvscope relay stopping: acking %d records in flight", self._inflight)
            timeout = self._config.producer.delivery_timeout_s + _DRAIN_MARGIN_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drain(), timeout)
        finally:
            for task in (connect, produce):
                task.cancel()
            await asyncio.gather(connect, produce, return_exceptions=True)
            if self._producer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._producer.stop(), 2.0)
            self.close()
            log.info("kvscope relay stopped")

    async def _connect(self, stop: asyncio.Event) -> None:
        """Start the producer, retrying with backoff while no broker answers (never fatal)."""
        settings = self._config.producer
        kwargs = {**producer_kwargs(settings), "linger_ms": self._config.linger_ms}
        backoff = Backoff(_RECONNECT_INITIAL_S, settings.reconnect_backoff_max_s)
        while not stop.is_set():
            producer = AIOKafkaProducer(**kwargs)
            try:
                await start_or_close(producer)
            except Exception as exc:
                self._tried.set()
                delay = backoff.next_delay()
                log.warning(
                    "kafka at %s not reachable (%s); batches are acked lost until it is; "
                    "retrying in %.1fs",
                    settings.bootstrap_servers,
                    type(exc).__name__,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            self._producer = producer
            self._tried.set()
            log.info("kvscope relay connected to %s", settings.bootstrap_servers)
            return

    async def _receive(self, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while True:
                message = asyncio.ensure_future(self._socket.recv_multipart())
                await asyncio.wait({message, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not message.done():
                    message.cancel()
                    return
                await self._take(message.result())
        finally:
            stopped.cancel()

    async def _take(self, frames: list[bytes]) -> None:
        """Admit one engine message: queue it for the producer, or ack it lost at once."""
        if len(frames) != 2:
            metrics.MALFORMED.inc()
            return
        identity, payload = frames
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError:
            metrics.MALFORMED.inc()
            return
        count = len(batch.records)
        metrics.RECEIVED.inc(count)
        if self._producer is None and self._tried.is_set():
            await self._ack(identity, batch.id, ["broker_unavailable"] * count)
        elif self._inflight + count > self._config.max_inflight_records:
            await self._ack(identity, batch.id, ["relay_full"] * count)
        else:
            self._inflight += count
            metrics.INFLIGHT.set(self._inflight)
            self._batches.put_nowait((identity, batch))

    async def _produce(self) -> None:
        """Hand each admitted batch's records to the producer, in order, then await its acks."""
        while True:
            identity, batch = await self._batches.get()
            await self._tried.wait()
            producer = self._producer
            if producer is None:
                results: list[_Result] = ["broker_unavailable"] * len(batch.records)
            else:
                results = await self._send(producer, batch.records)
            task = asyncio.create_task(self._ack_when_done(identity, batch.id, results))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)
            self._batches.task_done()

    async def _send(self, producer: AIOKafkaProducer, records: list[RelayRecord]) -> list[_Result]:
        """Hand `records` to the producer as record batches per (topic, partition), built
        here in order as the in-process sender builds them (cheaper than a `send()` per
        record). Each record's result is its batch's delivery future, or why it was lost
        before the producer took it."""
        results: list[_Result] = []
        partitions: dict[str, list[int] | str] = {}
        filling: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        for index, (topic, key, value) in enumerate(records):
            known = partitions.get(topic)
            if known is None:
                known = partitions[topic] = await _partitions(producer, topic)
            results.append(known if isinstance(known, str) else "send_failed")
            if isinstance(known, str):
                continue
            partition = self._partition(known, key)
            builder, members = filling.get((topic, partition)) or (producer.create_batch(), [])
            if builder.append(key=key, value=value, timestamp=None) is None:
                await _submit(producer, topic, partition, builder, members, results)
                builder, members = producer.create_batch(), []
                builder.append(key=key, value=value, timestamp=None)
            members.append(index)
            filling[(topic, partition)] = builder, members
        for (topic, partition), (builder, members) in filling.items():
            await _submit(producer, topic, partition, builder, members, results)
        return results

    async def _ack_when_done(self, identity: bytes, batch_id: int, results: list[_Result]) -> None:
        futures = [r for r in results if not isinstance(r, str)]
        settled = iter(await asyncio.gather(*futures, return_exceptions=True))
        outcomes: list[str | None] = []
        for result in results:
            if isinstance(result, str):
                outcomes.append(result)
                continue
            delivered = next(settled)
            failed = isinstance(delivered, BaseException)
            outcomes.append(loss_reason(delivered) if failed else None)
        self._inflight -= len(results)
        metrics.INFLIGHT.set(self._inflight)
        await self._ack(identity, batch_id, outcomes)

    async def _ack(self, identity: bytes, batch_id: int, outcomes: list[str | None]) -> None:
        """Tell the engine how batch `batch_id` ended (None: Kafka acknowledged the record)."""
        losses = loss_ranges(outcomes)
        delivered = outcomes.count(None)
        if delivered:
            metrics.DELIVERED.inc(delivered)
        for reason, count in Counter(r for r in outcomes if r is not None).items():
            metrics.LOST.labels(reason=reason).inc(count)
        ack = self._encoder.encode(RelayAck(batch_id, losses))
        with contextlib.suppress(zmq.ZMQError):  # the engine went away: nobody to tell
            await self._socket.send_multipart([identity, ack], zmq.NOBLOCK)

    async def _drain(self) -> None:
        await self._batches.join()
        while self._acks:
            await asyncio.gather(*self._acks, return_exceptions=True)


async def _partitions(producer: AIOKafkaProducer, topic: str) -> list[int] | str:
    """`topic`'s partitions, sorted, or why they could not be looked up (a loss reason)."""
    try:
        return sorted(await producer.partitions_for(topic))
    except Exception as exc:
        return loss_reason(exc)


async def _submit(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    builder: Any,
    members: list[int],
    results: list[_Result],
) -> None:
    """Hand one record batch to the producer; its records' results become its future."""
    try:
        future: _Result = await producer.send_batch(builder, topic, partition=partition)
    except Exception as exc:
        future = loss_reason(exc)
    for index in members:
        results[index] = future


def loss_ranges(outcomes: list[str | None]) -> list[RelayLoss]:
    """Runs of equal loss reasons as index ranges (delivered records name none)."""
    losses: list[RelayLoss] = []
    for index, reason in enumerate(outcomes):
        if reason is None:
            continue
        last = losses[-1] if losses else None
        if last is not None and last.last == index - 1 and last.reason == reason:
            last.last = index
        else:
            losses.append(RelayLoss(index, index, reason))
    return losses

"""The engine side of a per-host relay: `RelaySender` hands encoded records to `kvscope relay`.

With `relay` set, no Kafka client runs in the engine process (aiokafka is never imported):
the sender thread drains the queue once per linger as the in-process `Sender` does,
converts and encodes with the same `RecordEncoder`, and sends the round's records as
`RelayBatch` messages over a ZMQ DEALER socket to the relay, which produces them to Kafka
verbatim and answers each batch with a `RelayAck` naming what it lost.

The socket never queues for an absent relay (`IMMEDIATE`), so a send fails at once with
`zmq.Again`: those records are lost for `relay_unavailable`, and pending Gaps wait for a
probe once a second. A batch the relay never acknowledges within `delivery_timeout_s` +
`ACK_MARGIN_S` (it died holding it) is lost for `relay_unavailable` too, even though
Kafka may have stored some of it (docs/publisher.md, "Relay"). Every seq the engine
issued is therefore either acknowledged, or named by a Gap.

Wire (docs/wire-format.md, "Relay"): one ZMQ frame per message, msgpack arrays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import zmq
from kvscope.publisher.queue import RecordQueue
from kvscope.publisher.records import Member, RecordEncoder

if TYPE_CHECKING:
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.metrics import PublisherMetrics

log = logging.getLogger(__name__)

ACK_MARGIN_S = 5.0
"""How much longer than `delivery_timeout_s` a batch may wait for the relay's ack."""
MAX_BATCH_RECORDS = 5_000
"""Records per `RelayBatch` at most (a round with more sends several)."""
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Value bytes per `RelayBatch` at most."""
SEND_HWM = 64
"""Batches the socket holds for a connected relay before a send fails (`relay_full`)."""
ACK_POLL_S = 0.05
"""While batches wait for acks and nothing else is to do, the thread looks every this often."""
CONNECT_WAIT_MS = 1000
"""How long a new sender thread waits for the relay connection before its first round."""
_MAX_DRAIN = 50_000
_FLUSH_POLL_S = 0.002


class RelayRecord(NamedTuple):
    """One Kafka record for the relay to produce: topic, key and the encoded envelope."""

    topic: str
    key: bytes
    value: bytes


class RelayBatch(msgspec.Struct, array_like=True, gc=False):
    """Engine -> relay: records to produce, in order; `id` comes back in the ack."""

    id: int
    records: list[RelayRecord]


class RelayLoss(msgspec.Struct, array_like=True, gc=False):
    """Records `first..last` (indices into the batch, inclusive) lost for `reason`."""

    first: int
    last: int
    reason: str


class RelayAck(msgspec.Struct, array_like=True, gc=False):
    """Relay -> engine, once Kafka acknowledged or failed every record of batch `id`;
    every record not named in `lost` was acknowledged by Kafka."""

    id: int
    lost: list[RelayLoss] = msgspec.field(default_factory=list)


class _InFlight(NamedTuple):
    """A batch sent to the relay and not acknowledged yet."""

    members: list[Member]
    sent: float
    oldest: float


class _Outgoing:
    """The records of the batch being filled in this round."""

    def __init__(self) -> None:
        self.records: list[RelayRecord] = []
        self.members: list[Member] = []
        self.size = 0
        self.oldest = 0.0

    def take(self) -> tuple[list[Member], list[RelayRecord], float]:
        """The batch filled so far (members, records, oldest enqueue time); starts a new one."""
        taken = self.members, self.records, self.oldest
        self.records, self.members, self.size = [], [], 0
        return taken


class RelaySender:
    """The sender thread of a `KafkaPublisher` whose records go through a per-host relay.

    Given the same collaborators as `Sender`: the queue it drains (and reports losses
    to), the metrics and `topic`. The socket lives on this thread only; other threads
    only set its wake event and read its counters.
    """

    def __init__(
        self,
        config: PublisherConfig,
        *,
        queue: RecordQueue,
        metrics: PublisherMetrics,
        topic: Callable[[str], str],
    ) -> None:
        self._config = config
        self._queue = queue
        self._metrics = metrics
        self._topic = topic
        self._topics: dict[str, str] = {}
        self._records = RecordEncoder(config, queue=queue, metrics=metrics)
        self._wake = threading.Event()
        self._stopping = False
        self._idle = False
        self._in_round = False
        self._inflight: dict[int, _InFlight] = {}
        self._next_id = 0
        self._ack_timeout_s = config.delivery_timeout_s + ACK_MARGIN_S
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(RelayAck)
        self.rounds = 0
        """Send rounds so far (each one a wake of this thread); tests and debugging read it."""

    def run_forever(self) -> None:
        """Thread body: connect to the relay and send rounds until stopped; never raises.

        The ZMQ context is this thread's own, so a forked child makes a fresh one.
        """
        context = zmq.Context()
        try:
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.setsockopt(zmq.SNDHWM, SEND_HWM)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self._config.relay)
            # The connection completes in the background: give it a moment before the first
            # send, which would otherwise fail for a relay that is there (records queue).
            socket.poll(CONNECT_WAIT_MS, zmq.POLLOUT)
            log.info("kvscope publisher hands records to the relay at %s", self._config.relay)
            try:
                self._pump(socket)
            finally:
                socket.close(0)
        except Exception as exc:
            log.error("kvscope relay sender failed", exc_info=True)
            self._metrics.note_error("sender_loop", exc)
        finally:
            self._abandon_inflight()
            context.term()

    def wake(self) -> None:
        """Wake the thread from any thread (the queue calls it)."""
        self._wake.set()

    def flush_within(self, timeout_s: float) -> bool:
        """From another thread: wait until everything queued is acknowledged (or lost) and
        no Gap waits for a healthy relay; False if `timeout_s` passed first or losses wait."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        queue = self._queue
        while not self._stopping and (
            queue or self._inflight or self._in_round or (len(queue.losses) and self._healthy)
        ):
            if time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(_FLUSH_POLL_S)
        return not queue and not len(queue.losses)

    def stop_within(self, timeout_s: float) -> None:
        """Stop the thread (it ends within one round; what it holds in flight is lost)."""
        self._stopping = True
        self._wake.set()

    @property
    def _healthy(self) -> bool:
        return self._records.healthy

    def _pump(self, socket: zmq.Socket[Any]) -> None:
        linger = self._config.linger_ms / 1000
        while not self._stopping:
            if self._idle:
                self._idle_until_work()
            self._wake.wait(linger)
            self._wake.clear()
            if self._stopping:
                return
            self.rounds += 1
            self._in_round = True
            try:
                self._idle = not self._round(socket)
            except Exception:
                self._metrics.note_error("send")
                time.sleep(0.1)
            finally:
                self._in_round = False

    def _idle_until_work(self) -> None:
        """After a round that found nothing: sleep until a record (or flush, stop) wakes us,
        or, while batches wait for their acks, at most `ACK_POLL_S`."""
        queue = self._queue
        queue.armed = True
        if not queue and not len(queue.losses) and not self._stopping:
            self._wake.wait(ACK_POLL_S if self._inflight else None)
        queue.armed = False
        self._wake.clear()

    def _round(self, socket: zmq.Socket[Any]) -> bool:
        """Read acks, send pending Gaps and everything queued; False if there was nothing."""
        self._read_acks(socket)
        self._expire_inflight()
        records, queue = self._records, self._queue
        out = _Outgoing()
        try:
            gaps = records.gaps_due()
            now = time.monotonic()
            for lost in gaps:
                self._add(socket, out, records.gap(lost), now)
            drained = min(len(queue), _MAX_DRAIN)
            for _ in range(drained):
                item = queue.pop()
                self._add(socket, out, records.item(item), item.enqueued)
            self._send(socket, out)
        except BaseException:
            records.fail(out.members, "send_failed")  # never sent: report, do not lose silently
            raise
        return bool(gaps or drained or len(queue.losses))

    def _add(
        self,
        socket: zmq.Socket[Any],
        out: _Outgoing,
        record: tuple[Member, bytes] | None,
        enqueued: float,
    ) -> None:
        if record is None:
            return
        member, value = record
        if not out.members:
            out.oldest = enqueued
        topic = self._topics.get(member.stream)
        if topic is None:
            topic = self._topics[member.stream] = self._topic(member.stream)
        out.records.append(RelayRecord(topic, member.source.key, value))
        out.members.append(member)
        out.size += len(value)
        if len(out.members) >= MAX_BATCH_RECORDS or out.size >= MAX_BATCH_BYTES:
            self._send(socket, out)

    def _send(self, socket: zmq.Socket[Any], out: _Outgoing) -> None:
        """Send the filled batch (and start a new one); a refused send is a loss now."""
        if not out.members:
            return
        members, records, oldest = out.take()
        batch_id = self._next_id
        self._next_id += 1
        try:
            socket.send(self._encoder.encode(RelayBatch(batch_id, records)), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._records.healthy = False
            if not isinstance(exc, zmq.Again):
                self._metrics.note_error("relay", exc)
            self._records.fail(members, "relay_unavailable")
            return
        self._inflight[batch_id] = _InFlight(members, time.monotonic(), oldest)

    def _read_acks(self, socket: zmq.Socket[Any]) -> None:
        while True:
            try:
                frame = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                ack = self._decoder.decode(frame)
            except msgspec.DecodeError as exc:
                self._metrics.note_error("relay_ack", exc)
                continue
            batch = self._inflight.pop(ack.id, None)
            if batch is not None:  # else: already reported lost when its ack was overdue
                self._settle(batch, ack.lost)

    def _settle(self, batch: _InFlight, losses: list[RelayLoss]) -> None:
        """Book an acknowledged batch: the named records lost, the others published."""
        members = batch.members
        if losses:
            delivered = [True] * len(members)
            for loss in losses:
                first, last = max(loss.first, 0), min(loss.last, len(members) - 1)
                self._records.fail(members[first : last + 1], loss.reason)
                delivered[first : last + 1] = [False] * max(0, last - first + 1)
            members = [m for m, ok in zip(members, delivered, strict=True) if ok]
        self._records.healthy = not losses
        counts = Counter(m.stream for m in members)
        for stream, count in counts.items():
            self._records.delivered(stream, count)
        if counts:
            self._metrics.send_latency.observe(time.monotonic() - batch.oldest)

    def _expire_inflight(self) -> None:
        """Batches whose ack is overdue: the relay died holding them; report them lost."""
        limit = time.monotonic() - self._ack_timeout_s
        for batch_id in [i for i, b in self._inflight.items() if b.sent < limit]:
            self._records.healthy = False
            self._records.fail(self._inflight.pop(batch_id).members, "relay_unavailable")

    def _abandon_inflight(self) -> None:
        """When the thread ends: batches still in flight will never be acknowledged here."""
        inflight, self._inflight = self._inflight, {}
        for batch in inflight.values():
            self._records.fail(batch.members, "relay_unavailable")

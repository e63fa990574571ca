"""From queued items and pending losses to encoded Kafka record values: the transport-free
half of a sender, shared by the in-process `Sender` (aiokafka) and the `RelaySender`
(a per-host relay over a local socket).

`RecordEncoder` converts an engine-native item into its body, wraps it in an `Envelope`,
encodes it and checks its size; anything that fails on the way is reported lost (the loss
ledger turns it into a Gap). It also decides when pending losses go out as Gap records:
at once while the transport is `healthy`, else one probe a second. The transport reports
what it delivered through `delivered()` and what it could not through `fail()`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from kvscope.publisher.queue import Item, LostRange, QueuedSource, RecordQueue
from kvscope.schemas import Envelope, Gap

if TYPE_CHECKING:
    from kvscope.publisher.config import PublisherConfig
    from kvscope.publisher.metrics import PublisherMetrics

GAP_PROBE_INTERVAL_S = 1.0
"""While the transport is unhealthy, pending Gaps are tried once per this many seconds."""
KEY_AND_HEADER_BYTES = 64
"""Room a record needs beyond its key and value inside a produce request."""


@dataclass
class Member:
    """One record on its way: enough to report it lost (and the range it names, for a Gap)."""

    source: QueuedSource
    stream: str
    seq: int
    names: LostRange | None = None


class RecordEncoder:
    """Converts and encodes the records of one sender; reports every failure as a loss.

    Given the sender's `RecordQueue` (whose ledger books losses) and metrics. Not
    thread-safe: the sender thread alone calls it.
    """

    def __init__(
        self, config: PublisherConfig, *, queue: RecordQueue, metrics: PublisherMetrics
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._max_bytes = config.max_request_size
        self._encoder = msgspec.msgpack.Encoder()
        self.healthy = True
        """Whether the transport delivered lately (the sender sets it); pending Gaps wait
        for a probe while it is not."""
        self._last_probe = 0.0
        self._published: dict[str, Any] = {}

    def gaps_due(self) -> list[LostRange]:
        """Pending losses to send as Gaps now: all of them while healthy, else once a second."""
        ledger = self._queue.losses
        if not len(ledger):
            return []
        now = time.monotonic()
        if self.healthy or now - self._last_probe >= GAP_PROBE_INTERVAL_S:
            self._last_probe = now
            return ledger.take()
        return []

    def item(self, item: Item) -> tuple[Member, bytes] | None:
        """One queued item converted and encoded; None if it was lost on the way."""
        body = item.body
        if item.convert is not None:
            try:
                body = item.convert(body)
            except Exception:
                self._metrics.note_error("convert")
                self._queue.lost(item.source, item.stream, item.seq, item.seq, "convert_error")
                return None
        member = Member(item.source, item.stream, item.seq)
        return self._encode(member, item.ts, body)

    def gap(self, lost: LostRange) -> tuple[Member, bytes] | None:
        """The Gap record reporting `lost`, on a seq of its own; None if it was lost again."""
        source: QueuedSource = lost.owner  # type: ignore[assignment]
        seq = source.take_seq(lost.stream)
        body = Gap(first_seq=lost.first, last_seq=lost.last, reason=lost.reason)
        return self._encode(Member(source, lost.stream, seq, names=lost), time.time(), body)

    def _encode(self, member: Member, ts: float, body: Any) -> tuple[Member, bytes] | None:
        source = member.source
        try:
            value = self._encoder.encode(
                Envelope(source=source.source, epoch=source.epoch, seq=member.seq, ts=ts, body=body)
            )
        except Exception:
            self._metrics.note_error("encode")
            self.fail([member], "encode_error")
            return None
        if len(value) + len(source.key) + KEY_AND_HEADER_BYTES > self._max_bytes:
            self.fail([member], "too_large")
            return None
        return member, value

    def delivered(self, stream: str, count: int) -> None:
        """Count `count` records of `stream` acknowledged (the metric's child cached per stream)."""
        counter = self._published.get(stream)
        if counter is None:
            counter = self._published[stream] = self._metrics.published.labels(stream=stream)
        counter.inc(count)

    def fail(self, members: list[Member], reason: str) -> None:
        """Report `members` lost for `reason` (a lost Gap puts its range back in the ledger)."""
        for member in members:
            if member.names is not None:
                lost = member.names
                self._queue.losses.add(lost.owner, lost.stream, lost.first, lost.last, lost.reason)
            self._queue.lost(member.source, member.stream, member.seq, member.seq, reason)

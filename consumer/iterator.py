"""An async iterator over kvscope records on Kafka, built on aiokafka."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer
from kvscope.common.kafka import start_or_close
from kvscope.schemas import (
    DEFAULT_TOPIC_PREFIX,
    STREAMS,
    DecodeError,
    Envelope,
    decode,
    topic_for,
)
from kvscope.schemas.streams import topic_prefix_problem

log = logging.getLogger(__name__)


class Record(NamedTuple):
    """One Kafka record of a kvscope topic, decoded."""

    topic: str
    partition: int
    offset: int
    key: str
    """`{instance}/{dp_rank}` of the source."""
    envelope: Envelope | None
    """The decoded envelope; None when the value could not be decoded (see `error`)."""
    error: str | None = None
    """Why the value could not be decoded (a newer schema, not msgpack, ...)."""
    value: bytes = b""
    """The raw record value (msgpack), e.g. to forward or store it unchanged."""


LONGEST_FETCH_WAIT_S = 60.0
"""`getmany` waits longer in several fetches of at most this long (an infinite timeout
overflowed aiokafka's milliseconds)."""


class EnvelopeConsumer:
    """Consumes kvscope streams and yields `Record`s with decoded envelopes.

    Without `group_id` it reads every partition from the beginning (or the end with
    `from_beginning=False`) and commits nothing; with one it joins that consumer group
    and auto-commits like any aiokafka consumer. Extra keyword arguments go to
    `AIOKafkaConsumer` (security settings, session timeouts, ...). Undecodable values
    are yielded with `envelope=None` and the reason, never raised, so one bad record
    cannot stop a consumer.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        streams: Sequence[str] = STREAMS,
        *,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        group_id: str | None = None,
        from_beginning: bool = True,
        **kafka_options: Any,
    ) -> None:
        """`streams`: stream names (kv-events, engine-stats, ...), mapped to topics; one
        name alone may be given as a string. A bad name or prefix raises ValueError."""
        problem = topic_prefix_problem(topic_prefix)
        if problem:
            raise ValueError(problem)
        names = [streams] if isinstance(streams, str) else streams
        self.topics = [topic_for(stream, topic_prefix) for stream in names]
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=bootstrap_servers,
            group_id=group_id,
            enable_auto_commit=group_id is not None,
            auto_offset_reset="earliest" if from_beginning else "latest",
            **kafka_options,
        )

    async def start(self) -> None:
        """Connect and subscribe; on failure (no broker answers) nothing is left open."""
        await start_or_close(self._consumer)
        log.info("kvscope consumer started on %s", ", ".join(self.topics))

    async def stop(self) -> None:
        """Leave the group and close the connection."""
        await self._consumer.stop()
        log.info("kvscope consumer stopped")

    async def __aenter__(self) -> EnvelopeConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._records()

    async def getmany(self, timeout_s: float) -> list[Record]:
        """Every record that arrives within `timeout_s` (possibly none), in partition order.

        `math.inf` waits until records arrive; a negative or nan timeout raises ValueError.
        """
        if not timeout_s >= 0:
            raise ValueError(
                f"timeout_s must be >= 0 seconds (inf: until records arrive), got {timeout_s}"
            )
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            wait_s = min(remaining, LONGEST_FETCH_WAIT_S)
            batches = await self._consumer.getmany(timeout_ms=int(wait_s * 1000))
            if batches or remaining <= LONGEST_FETCH_WAIT_S:
                break
        return [_record(message) for messages in batches.values() for message in messages]

    async def _records(self) -> AsyncIterator[Record]:
        async for message in self._consumer:
            yield _record(message)


def _record(message: Any) -> Record:
    key = message.key.decode("utf-8", "replace") if message.key else ""
    if message.value is None:  # a tombstone: not kvscope's, nothing to decode
        return Record(message.topic, message.partition, message.offset, key, None, "no value")
    try:
        envelope, error = decode(message.value), None
    except DecodeError as exc:
        envelope, error = None, str(exc)
    return Record(
        message.topic, message.partition, message.offset, key, envelope, error, message.value
    )


def read_envelopes(
    bootstrap_servers: str,
    streams: Sequence[str] = STREAMS,
    *,
    topic_prefix: str = DEFAULT_TOPIC_PREFIX,
    idle_timeout_s: float = 3.0,
    max_records: int | None = None,
    **kafka_options: Any,
) -> list[Record]:
    """Read the streams from the beginning until nothing new arrives for `idle_timeout_s`,
    or until `max_records` records (None: no limit) were read.

    A blocking convenience for scripts and notebooks (runs its own event loop).
    `idle_timeout_s` must be > 0 (ValueError): at 0 the first fetch is not even waited for.
    """
    if not idle_timeout_s > 0:
        raise ValueError(f"idle_timeout_s must be > 0 seconds, got {idle_timeout_s}")

    async def collect() -> list[Record]:
        records: list[Record] = []
        async with EnvelopeConsumer(
            bootstrap_servers, streams, topic_prefix=topic_prefix, **kafka_options
        ) as consumer:
            while max_records is None or len(records) < max_records:
                batch = await consumer.getmany(idle_timeout_s)
                if not batch:
                    break
                records.extend(batch)
        return records[:max_records]

    return asyncio.run(collect())

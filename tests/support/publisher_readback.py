"""Read kvscope topics back from the real broker and decode them (shared by publisher tests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from kvscope.schemas import Envelope, Gap, decode
from prometheus_client import REGISTRY


@dataclass(frozen=True)
class Record:
    """One consumed record: topic, key and the decoded envelope."""

    topic: str
    key: bytes
    envelope: Envelope


def consume(
    bootstrap_servers: str,
    topics: list[str],
    done: Callable[[list[Record]], bool],
    timeout_s: float = 20.0,
) -> list[Record]:
    """Read `topics` from the beginning (no consumer group) until `done(records)` or timeout."""

    async def run() -> list[Record]:
        consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        try:
            while not done(records) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=300)
                for messages in batches.values():
                    records += [Record(m.topic, m.key or b"", decode(m.value)) for m in messages]
        finally:
            await consumer.stop()
        return records

    return asyncio.run(run())


def covered_seqs(records: list[Record]) -> set[int]:
    """Seqs present as records plus every seq a Gap record names."""
    seqs: set[int] = set()
    for record in records:
        seqs.add(record.envelope.seq)
        body = record.envelope.body
        if isinstance(body, Gap):
            seqs.update(range(body.first_seq, body.last_seq + 1))
    return seqs


def dropped(stream: str, reason: str) -> float:
    """kvscope_publisher_dropped_total for one stream and reason (0 before the first drop)."""
    value = REGISTRY.get_sample_value(
        "kvscope_publisher_dropped_total", {"stream": stream, "reason": reason}
    )
    return value or 0.0

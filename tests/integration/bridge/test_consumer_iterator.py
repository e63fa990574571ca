"""kvscope.consumer on the real broker: async iteration in a group, undecodable records."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from kvscope.consumer import EnvelopeConsumer, Record, read_envelopes
from kvscope.schemas import EngineStats, Envelope, Source, encode, topic_for
from support.collector_testkit import SESSION_TIMEOUT_MS


def test_async_iteration_in_a_group_yields_bad_records_without_raising(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    topic = topic_for("engine-stats", topic_prefix)
    good = Envelope(
        source=Source(instance="i"), epoch=1, seq=0, ts=1.0,
        body=EngineStats(capacity_blocks=8, block_size=16, usage=0.5),
    )  # fmt: skip

    async def scenario() -> list[Record]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers)
        await producer.start()
        try:
            for value in (encode(good), b"\xc1 not msgpack", encode(good)):
                await producer.send_and_wait(topic, value, key=b"i/0", partition=0)
        finally:
            await producer.stop()
        seen: list[Record] = []
        async with EnvelopeConsumer(
            bootstrap_servers,
            ["engine-stats"],
            topic_prefix=topic_prefix,
            group_id=f"g-{topic_prefix}",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=500,
        ) as consumer:
            async for record in consumer:
                seen.append(record)
                if len(seen) == 3:
                    break
        return seen

    records = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [r.offset for r in records] == [0, 1, 2]
    assert [r.envelope for r in records] == [good, None, good]
    assert records[1].error is not None and "msgpack" in records[1].error
    assert records[1].value == b"\xc1 not msgpack"
    assert {r.key for r in records} == {"i/0"}


def test_records_that_are_not_kvscope_s_are_yielded_not_raised(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    """A tombstone (no value), an empty value and a JSON record on a kvscope topic."""
    topic = topic_for("engine-stats", topic_prefix)
    values = [None, b"", b'{"json": 1}']

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers)
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(topic, value, key=b"\xff\xfe", partition=0)
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(produce(), 60))
    records = read_envelopes(
        bootstrap_servers, ["engine-stats"], topic_prefix=topic_prefix, idle_timeout_s=2
    )
    assert [(r.offset, r.envelope, r.value) for r in records] == [
        (0, None, b""),
        (1, None, b""),
        (2, None, b'{"json": 1}'),
    ]
    assert all(r.error for r in records), records
    assert records[0].error == "no value"
    first = read_envelopes(
        bootstrap_servers, ["engine-stats"], topic_prefix=topic_prefix, max_records=2
    )
    assert [r.offset for r in first] == [0, 1]
    # no idle limit: reads until max_records (an infinite wait overflowed aiokafka's ms)
    unbounded = read_envelopes(
        bootstrap_servers,
        ["engine-stats"],
        topic_prefix=topic_prefix,
        max_records=3,
        idle_timeout_s=math.inf,
    )
    assert [r.offset for r in unbounded] == [0, 1, 2]


@pytest.mark.parametrize(
    "streams,prefix,needle",
    [
        (["engine-stats"], "bad prefix", "topic prefix 'bad prefix' has ' '"),
        (["engine-stats"], "", "the topic prefix is empty"),
        (["nope"], "kvscope.", "unknown stream 'nope'"),
    ],
)
def test_bad_streams_or_prefix_are_refused_before_connecting(
    streams: list[str], prefix: str, needle: str
) -> None:
    """Refused at once: the broker is never asked (it was 40 s of retries, then an error)."""
    with pytest.raises(ValueError, match=re.escape(needle)):
        EnvelopeConsumer("127.0.0.1:1", streams, topic_prefix=prefix)


@pytest.mark.parametrize("idle", [0, -1, float("nan")])
def test_read_envelopes_refuses_an_idle_timeout_that_reads_nothing(idle: float) -> None:
    """0 returned [] at once from a topic full of records (the first fetch not waited for)."""
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        read_envelopes("127.0.0.1:1", ["kv-events"], idle_timeout_s=idle)


@pytest.mark.parametrize("timeout_s", [-1, float("nan"), -math.inf])
def test_getmany_refuses_a_timeout_that_is_no_duration(timeout_s: float) -> None:
    async def scenario() -> None:
        consumer = EnvelopeConsumer("127.0.0.1:1", "kv-events", topic_prefix="p.")
        try:
            await consumer.getmany(timeout_s)
        finally:
            await consumer.stop()

    with pytest.raises(ValueError, match="timeout_s must be >= 0 seconds"):
        asyncio.run(scenario())


def test_one_stream_may_be_named_by_a_string() -> None:
    async def topics() -> list[str]:
        consumer = EnvelopeConsumer("127.0.0.1:1", "kv-events", topic_prefix="p.")
        await consumer.stop()
        return consumer.topics

    assert asyncio.run(topics()) == ["p.kv-events"]


def test_a_broker_that_does_not_answer_leaves_nothing_open() -> None:
    """The start's error comes out and the aiokafka consumer is closed (it was left for the
    garbage collector, which warned 'Unclosed AIOKafkaConsumer')."""

    async def scenario() -> EnvelopeConsumer:
        consumer = EnvelopeConsumer("127.0.0.1:1", ["kv-events"], request_timeout_ms=2000)
        with pytest.raises(KafkaConnectionError):
            async with consumer:
                pytest.fail("reached a broker on port 1")
        return consumer

    consumer = asyncio.run(scenario())
    assert consumer._consumer._closed is True  # what aiokafka's own 'Unclosed' check reads

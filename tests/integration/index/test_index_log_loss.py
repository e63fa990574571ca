"""`kvscope index` and the router's in-process index after a broker that came back without
its log: the local broker's memory storage loses every record on restart, so offsets start
at 0 again. The index reaches the broker through `RefusingProxy`, so a test decides whether
the new log grows before the index reconnects (its old positions then name other records:
before the fix it skipped the new log's records below them) or after (its positions lie past
the new log's end); the router's index meets both, in both orders. Either way the index
must end with the state of an independent replay of everything published (the index
applied all of the old log before each loss), keep answering while the broker is away, and
name each reset in one log line."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.local.broker import LocalBroker
from kvscope.route.embedded import EmbeddedIndex
from kvscope.schemas import Envelope
from support.collector_testkit import publish_envelopes
from support.index_kit import IndexProcess, wait_for
from support.index_streams import hostile_stream, replayed_state
from support.refusing_proxy import RefusingProxy

RESET_LINE = re.compile(r"\[(\d+)\] no longer holds the records applied")


@pytest.fixture
def broker() -> Iterator[LocalBroker]:
    """A broker of this test's own: the test restarts it (the session's must keep its log)."""
    local = LocalBroker().start()
    yield local
    local.stop()


@pytest.fixture
def proxy(broker: LocalBroker) -> Iterator[RefusingProxy]:
    """The index's way to the broker, cut while the broker restarts and gets new records."""
    injector = RefusingProxy(broker.bootstrap_servers).start()
    yield injector
    injector.stop()


def _publish(broker: LocalBroker, prefix: str, envelopes: list[Envelope]) -> None:
    asyncio.run(publish_envelopes(broker.bootstrap_servers, prefix, "kv-events", envelopes))


def _restart_without_log(broker: LocalBroker) -> None:
    """Stop the broker and start it again on the same port: every topic and record is gone."""
    port = broker.port
    broker.stop()
    broker.port = port
    broker.start()


def _cuts(stream: list[Envelope], *sizes: int) -> list[list[Envelope]]:
    """`stream` in consecutive pieces of `sizes` records, the rest last (sources keep their
    epochs and continue their seqs from piece to piece, as publishers do)."""
    pieces, start = [], 0
    for size in sizes:
        pieces.append(stream[start : start + size])
        start += size
    return [*pieces, stream[start:]]


def _resets(text: str) -> list[int]:
    return [int(p) for p in RESET_LINE.findall(text)]


def test_the_index_reads_a_new_log_grown_past_it_before_it_reconnects(
    broker: LocalBroker, proxy: RefusingProxy, topic_prefix: str, tmp_path: Path
) -> None:
    """The new log outgrows the old one before the index is back: its old positions name
    other records of the new log (the case that skipped records silently)."""
    stream = hostile_stream(44, 600, sources=5, universe=300)
    old, grown = _cuts(stream, 200)
    _publish(broker, topic_prefix, old)
    index = IndexProcess(proxy.bootstrap_servers, topic_prefix, tmp_path / "i.log").start()
    try:
        wait_for(lambda: index.request("/healthz")[0] == 200, "caught up")
        assert index.state() == replayed_state(old)
        proxy.down()
        wait_for(lambda: index.request("/healthz")[0] == 503, "the outage noticed")
        _restart_without_log(broker)
        _publish(broker, topic_prefix, grown)
        status, answer = index.request("/score", {"block_hashes": [1, 2, 3]})
        assert status == 200 and answer["ready"] is False
        assert index.state() == replayed_state(old)  # kept while the broker is away
        proxy.up()
        wait_for(lambda: index.request("/healthz")[0] == 200, "the new log read")
        assert index.state() == replayed_state(stream)
        named = _resets(index.output())
        assert named and len(set(named)) == len(named)  # each partition named once
        metrics = index.request("/metrics")[1]
        assert f"kvscope_index_log_resets_total {len(named)}.0" in metrics
    finally:
        assert index.stop() == 0
    assert "Traceback" not in index.output()


def test_the_routers_index_reads_a_new_log_after_and_before_it_reconnects(
    broker: LocalBroker,
    proxy: RefusingProxy,
    topic_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The other order and other sizes: first a short new log that grows after the index is
    back, then a new log that outgrows the old one before it is back."""
    old, short, later, grown = _cuts(hostile_stream(45, 1000, sources=6, universe=200), 300, 5, 150)
    config = IndexConfig(
        KafkaSettings(bootstrap_servers=proxy.bootstrap_servers), topic_prefix=topic_prefix
    )
    embedded = EmbeddedIndex(config)
    index = embedded.service.index

    def state() -> dict[tuple[str, int], tuple[set[int], bool]]:
        out = {}
        for row in index.sources():
            key = (row.instance, row.dp_rank)
            hashes, cursor = index.resident(*key, limit=100_000)
            assert cursor is None
            out[key] = (set(hashes), row.stale)
        return out

    async def wait(check: Any, what: str) -> None:
        """Poll `check` on the event loop (the index is the loop's alone)."""
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def exercise() -> tuple[list[bool], list[int]]:
        answered, resets = [], []
        published = list(old)
        await asyncio.to_thread(_publish, broker, topic_prefix, old)
        async with embedded.feeding():
            await wait(lambda: embedded.failure() is None, "caught up")
            assert state() == replayed_state(old)
            for first, then in ((short, later), (grown, [])):
                await asyncio.to_thread(proxy.down)
                await wait(lambda: "disconnected" in embedded.describe(), "the outage noticed")
                await asyncio.to_thread(_restart_without_log, broker)
                await asyncio.to_thread(_publish, broker, topic_prefix, first)
                answered.append(index.score([1, 2, 3]) is not None)  # the broker is away
                assert state() == replayed_state(published)
                await asyncio.to_thread(proxy.up)
                await wait(lambda: embedded.failure() is None, "the new log read")
                await asyncio.to_thread(_publish, broker, topic_prefix, then)
                published += first + then
                expected = replayed_state(published)
                await wait(lambda: state() == expected, "the grown log applied")  # noqa: B023
                resets.append(len(_resets(caplog.text)))
        return answered, resets

    with caplog.at_level(logging.ERROR, logger="kvscope.index.feed"):
        answered, resets = asyncio.run(exercise())
    assert answered == [True, True]
    named = _resets(caplog.text)
    first, second = named[: resets[0]], named[resets[0] : resets[1]]
    assert first and len(set(first)) == len(first)  # each partition named once per loss
    assert second and len(set(second)) == len(second)

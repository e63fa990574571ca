"""`kvscope index` and the router's in-process index through broker outages (the real broker
behind `RefusingProxy`, whose `down()` drops and refuses every connection while the broker
keeps its log): they keep answering, flagged not ready, and resume exactly where they were."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.route.embedded import EmbeddedIndex
from support.collector_testkit import publish_envelopes
from support.index_kit import IndexProcess, wait_for
from support.index_streams import hostile_stream, replayed_state
from support.refusing_proxy import RefusingProxy


@pytest.fixture
def proxy(bootstrap_servers: str) -> Iterator[RefusingProxy]:
    """The real broker behind a proxy that can drop and refuse connections on demand."""
    injector = RefusingProxy(bootstrap_servers).start()
    yield injector
    injector.stop()


def _publish(bootstrap: str, prefix: str, envelopes: list[Any]) -> None:
    asyncio.run(publish_envelopes(bootstrap, prefix, "kv-events", envelopes))


def test_the_index_answers_through_an_outage_and_resumes_exactly(
    bootstrap_servers: str, topic_prefix: str, proxy: RefusingProxy, tmp_path: Path
) -> None:
    stream = hostile_stream(41, records=600, sources=5, universe=300)
    before, during = stream[:300], stream[300:]
    _publish(bootstrap_servers, topic_prefix, before)
    index = IndexProcess(proxy.bootstrap_servers, topic_prefix, tmp_path / "i.log").start()
    try:
        wait_for(lambda: index.request("/healthz")[0] == 200, "caught up")
        assert index.state() == replayed_state(before)
        proxy.down()
        _publish(bootstrap_servers, topic_prefix, during)  # straight to the broker
        status, health = wait_for(
            lambda: (s := index.request("/healthz"))[0] == 503 and s, "the outage noticed"
        )
        assert health["connected"] is False and health["ok"] is False
        assert "not connected to Kafka" in health["reason"] and health["last_error"]
        status, answer = index.request("/score", {"block_hashes": [1, 2, 3]})
        assert status == 200 and answer["ready"] is False and answer["lag_s"] > 0
        assert index.state() == replayed_state(before)  # the state is kept, not dropped
        proxy.up()
        wait_for(lambda: index.request("/healthz")[0] == 200, "reconnected and caught up")
        assert index.state() == replayed_state(stream)  # nothing missed, nothing doubled
        assert index.request("/score", {"block_hashes": [1]})[1]["ready"] is True
        metrics = index.request("/metrics")[1]
        assert "kvscope_index_reconnects_total 1.0" in metrics
    finally:
        assert index.stop() == 0
    assert "Traceback" not in index.output()


def test_the_routers_index_trusts_a_short_outage_and_then_names_it(
    bootstrap_servers: str, topic_prefix: str, proxy: RefusingProxy
) -> None:
    stream = hostile_stream(42, records=400, sources=4, universe=200)
    _publish(bootstrap_servers, topic_prefix, stream[:200])
    config = IndexConfig(
        KafkaSettings(bootstrap_servers=proxy.bootstrap_servers),
        topic_prefix=topic_prefix,
        disconnected_grace_s=1.0,
    )
    embedded = EmbeddedIndex(config)

    async def wait(check: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def exercise() -> tuple[list[str | None], dict[Any, set[int]]]:
        seen: list[str | None] = []
        async with embedded.feeding():
            assert embedded.failure() is not None  # not caught up yet
            await wait(lambda: embedded.failure() is None, "caught up")
            await asyncio.to_thread(proxy.down)
            await asyncio.to_thread(_publish, bootstrap_servers, topic_prefix, stream[200:])
            await wait(lambda: "disconnected" in embedded.describe(), "the outage noticed")
            seen.append(embedded.failure())  # within the grace: still trusted
            await wait(lambda: embedded.failure() is not None, "the grace to pass")
            seen.append(embedded.failure())
            seen.append(embedded.describe())
            await asyncio.to_thread(proxy.up)
            await wait(lambda: embedded.failure() is None, "reconnected and caught up")
            index = embedded.service.index
            got = {key: set(_all_resident(index, *key)) for key in replayed_state(stream)}
        return seen, got

    seen, got = asyncio.run(exercise())
    assert seen[0] is None
    assert seen[1] is not None and "not connected to Kafka" in seen[1]
    assert seen[2] is not None and "disconnected for" in seen[2]
    assert got == {key: hashes for key, (hashes, _) in replayed_state(stream).items()}


def _all_resident(index: Any, instance: str, dp_rank: int) -> list[int]:
    hashes, cursor = index.resident(instance, dp_rank, limit=100_000)
    assert cursor is None
    return list(hashes)


def test_idle_sources_expire_only_while_the_feed_is_current(
    bootstrap_servers: str, topic_prefix: str, proxy: RefusingProxy
) -> None:
    stream = hostile_stream(43, records=60, sources=3, universe=50)
    _publish(bootstrap_servers, topic_prefix, stream)
    config = IndexConfig(
        KafkaSettings(bootstrap_servers=proxy.bootstrap_servers),
        topic_prefix=topic_prefix,
        source_idle_expiry_s=2.0,
    )
    embedded = EmbeddedIndex(config)

    async def exercise() -> tuple[int, int, int]:
        index = embedded.service.index
        async with embedded.feeding():
            while not embedded.caught_up:
                await asyncio.sleep(0.02)
            started = time.monotonic()
            fed = len(index.sources())
            await asyncio.to_thread(proxy.down)
            await asyncio.sleep(max(0.0, started + 3.0 - time.monotonic()))  # past the idle time
            during = len(index.sources())
            await asyncio.to_thread(proxy.up)
            deadline = time.monotonic() + 60
            while index.sources() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return fed, during, len(index.sources())

    fed, during, after = asyncio.run(exercise())
    assert fed == len(replayed_state(stream)) and during == fed  # an outage expires nothing
    assert after == 0 and embedded.service.index.live_slots == 0

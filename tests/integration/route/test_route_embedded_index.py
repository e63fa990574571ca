"""`kvscope route`'s own index (`--index-bootstrap-servers`) on the real broker: fed from the
kv-events topic to the exact state a replay of the records gives, scoring token ids as the
engines hash them, and a feed that stopped means routing by load (reported by /healthz),
never a refused request.

The feed's stop is injected by cancelling its task (a real feed stops only on an error
the broker cannot be made to produce on demand); the engine is a fake (`FakeEngine`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from kvscope.common.kafka import KafkaSettings
from kvscope.index.config import IndexConfig
from kvscope.index.hashing import BlockHasher
from kvscope.route.app import build_app
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.route.embedded import EmbeddedIndex
from kvscope.route.index_client import Prompt
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch
from prometheus_client import REGISTRY
from support.collector_testkit import publish_envelopes
from support.index_streams import Replay, hostile_stream
from support.route_fleet import FakeEngine, Servers

BLOCK = 16


def stored(instance: str, ids: list[int], seq: int, hasher: BlockHasher) -> Envelope:
    """A batch in which `instance` stores the full blocks of `ids`."""
    hashes = hasher.block_hashes(ids, BLOCK)
    event = BlockStored(block_hashes=hashes, block_size=BLOCK, token_count=len(hashes) * BLOCK)
    body = KVEventBatch(ts=float(seq), events=[event])
    source = Source(instance=instance, model="tiny")
    return Envelope(source=source, epoch=7, seq=seq, ts=float(seq), body=body)


def resident(embedded: EmbeddedIndex, keys: list[tuple[str, int]]) -> dict[Any, set[int]]:
    index = embedded.service.index
    return {key: set(index.resident(*key, limit=100_000)[0]) for key in keys}


async def until(check: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the router's index never caught up"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(("seed", "records", "sources"), [(1, 40, 1), (2, 400, 4), (3, 900, 7)])
def test_the_routers_index_is_exact_and_scores_token_ids(
    bootstrap_servers: str, topic_prefix: str, seed: int, records: int, sources: int
) -> None:
    hostile = hostile_stream(seed, records=records, sources=sources, universe=300)
    replay = Replay()
    for envelope in hostile:
        replay.apply(envelope)
    hasher = BlockHasher("sha256", "0")
    prompt = list(range(5, 5 + 4 * BLOCK + 3))  # 4 full blocks and a partial one
    held = [stored("holder", prompt[: 2 * BLOCK], 0, hasher), stored("holder", prompt, 1, hasher)]
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", hostile + held))
    config = IndexConfig(
        KafkaSettings(bootstrap_servers=bootstrap_servers), topic_prefix=topic_prefix, hash_seed="0"
    )
    embedded = EmbeddedIndex(config)
    client = embedded.client()

    async def exercise() -> tuple[Any, Any, Any]:
        async with embedded.feeding():
            await until(lambda: embedded.caught_up)
            assert "caught up" in embedded.describe()
            scores = await client.score(Prompt([*prompt, 99], "tiny"))
            salted = await client.score(Prompt([*prompt, 99], "tiny", cache_salt="s"))
            unknown = await client.score(Prompt(prompt, "no-such-model"))
            assert {s.instance: s.matched_tokens for s in salted.sources}.get("holder", 0) == 0
            return resident(embedded, list(replay.sources)), scores, unknown

    got, scores, unknown = asyncio.run(exercise())
    assert got == {key: replay.resident(*key) for key in replay.sources}
    matched = {s.instance: s.matched_tokens for s in scores.sources}
    assert matched["holder"] == 4 * BLOCK
    assert unknown.sources == []
    assert embedded.failure() == "the router's index is not running"


def test_a_stopped_feed_means_routing_by_load(bootstrap_servers: str, topic_prefix: str) -> None:
    hasher = BlockHasher("sha256", "0")
    prompt = list(range(3, 3 + 2 * BLOCK))
    asyncio.run(
        publish_envelopes(
            bootstrap_servers, topic_prefix, "kv-events", [stored("e0", prompt, 0, hasher)]
        )
    )
    index = IndexConfig(
        KafkaSettings(bootstrap_servers=bootstrap_servers), topic_prefix=topic_prefix, hash_seed="0"
    )
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    before = metric("kvscope_route_decisions_total", engine="e0", basis="index_down")

    async def exercise(app: Any) -> tuple[dict[str, Any], httpx.Response, dict[str, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://route") as client,
            app.router.lifespan_context(app),
        ):
            health = (await client.get("/healthz")).json()
            feed = next(t for t in asyncio.all_tasks() if t.get_name() == "kvscope-index-feed")
            feed.cancel()
            await asyncio.gather(feed, return_exceptions=True)
            answer = await client.post("/v1/completions", json=body)
            return health, answer, (await client.get("/healthz")).json()

    with Servers() as servers:
        engines = (EngineSpec("e0", servers.start(FakeEngine("e0"))),)
        app = build_app(RouteConfig(engines=engines, embedded_index=index))
        health, answer, after = asyncio.run(exercise(app))
    assert health["index"]["at"].startswith(f"in process, reading {topic_prefix}kv-events")
    assert answer.status_code == 200, answer.text
    assert metric("kvscope_route_decisions_total", engine="e0", basis="index_down") == before + 1
    assert after["ok"] is True and after["index"]["state"] == "down"
    assert "stopped reading" in after["index"]["detail"]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0

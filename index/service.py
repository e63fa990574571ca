"""`kvscope index` wired: config -> state -> cold start -> Kafka feed -> HTTP API.

Each part is testable alone (`state`, `stored`, `feed`, `api`); this module only builds
them in order and runs the feed and the HTTP server on one event loop until stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from kvscope.index import metrics
from kvscope.index.api import IndexApi
from kvscope.index.config import IndexConfig
from kvscope.index.feed import IndexFeed
from kvscope.index.hashing import BlockHasher
from kvscope.index.state import PrefixIndex
from kvscope.web.server import listen, serve

if TYPE_CHECKING:  # pyarrow and the ClickHouse client: loaded for a cold start only
    from kvscope.index.stored import SnapshotReader

log = logging.getLogger(__name__)

EXPIRY_CHECK_S = 5.0
"""Longest time between two looks for idle sources."""
SWEEP_IDLE_S = 0.05
"""How often the sweeper looks for table buckets to delete while there are none."""


class IndexService:
    """One index process: its state, where it started from, its feed and its listener."""

    def __init__(self, config: IndexConfig, snapshots: SnapshotReader | None = None) -> None:
        self.config = config.validate()
        self.snapshots = snapshots
        self.index = PrefixIndex(config.tier_weights)
        self.hasher = BlockHasher(config.hash_algo, config.hash_seed)
        self.url = ""
        """The URL clients use, once listening."""
        self.cold_start_s = 0.0
        self.started_from = "the beginning of the topic"
        """Where the state came from: stored positions, or the topic's beginning."""

    def cold_start(self) -> dict[int, int]:
        """Load the stored state (if any reader); the Kafka positions to go on from."""
        if self.snapshots is None:
            return {}
        from kvscope.index.stored import load

        started = time.perf_counter()
        try:
            snapshot = self.snapshots.read(self.config.topic)
        finally:
            close = getattr(self.snapshots, "close", None)
            if close is not None:  # a chDB directory is needed for the cold start only
                close()
        events = load(self.index, snapshot)
        self.cold_start_s = time.perf_counter() - started
        metrics.COLD_START_SECONDS.set(self.cold_start_s)
        self.started_from = (
            f"stored state ({len(snapshot.positions)} partitions, "
            f"{snapshot.sources.num_rows} sources, {self.index.table.entries:,} resident "
            f"blocks from {events:,} stored block events, {self.cold_start_s:.1f} s)"
        )
        return snapshot.positions

    @contextlib.asynccontextmanager
    async def feeding(self) -> AsyncIterator[IndexFeed]:
        """Cold start, then the Kafka feed applying records on this event loop while the
        block runs (it connects, and reconnects after outages, by itself; `feed.task` ends
        only with a bug's error); with `source_idle_expiry_s`, idle sources are dropped
        while the feed is current; the sweeper deletes what dropped sources left in the
        table. Everything is stopped after the block."""
        positions = await asyncio.to_thread(self.cold_start)
        feed = IndexFeed(self.index, self.config.kafka, self.config.topic, positions)
        feed.task = asyncio.create_task(feed.run(), name="kvscope-index-feed")
        helpers = (
            asyncio.create_task(self._expire(feed), name="kvscope-index-expiry"),
            asyncio.create_task(self._sweep(), name="kvscope-index-sweep"),
        )
        try:
            yield feed
        finally:
            for task in (feed.task, *helpers):
                task.cancel()
            await asyncio.gather(feed.task, *helpers, return_exceptions=True)
            await feed.stop()

    async def _expire(self, feed: IndexFeed) -> None:
        """Drop sources idle longer than `source_idle_expiry_s` (off when None), only while
        the feed is current: an outage silences every source without them being gone."""
        idle_s = self.config.source_idle_expiry_s
        if idle_s is None:
            return
        while True:
            await asyncio.sleep(min(idle_s / 4, EXPIRY_CHECK_S))
            if feed.status().ready:
                for instance, dp_rank in self.index.forget_idle(idle_s):
                    log.info("index forgot idle source %s/%d", instance, dp_rank)
                    metrics.FORGOTTEN_SOURCES.inc()

    async def _sweep(self) -> None:
        """Delete the table buckets that forgotten, cleared or restarted sources emptied,
        one bounded step (about a millisecond) per turn of the event loop, so answers and
        the feed run in between; each applied batch sweeps a step too, this keeps the
        sweep going while the topic is quiet."""
        while True:
            await asyncio.sleep(0 if self.index.sweep() else SWEEP_IDLE_S)

    async def run(self, ready: Callable[[IndexService], None] | None = None) -> None:
        """Cold start, then feed and serve until cancelled or signalled."""
        sock = listen(self.config.host, self.config.port)  # a taken port fails first
        try:
            async with self.feeding() as feed:
                await self._serve(sock, feed, ready)
        finally:
            sock.close()

    async def _serve(
        self,
        sock: socket.socket,
        feed: IndexFeed,
        ready: Callable[[IndexService], None] | None,
    ) -> None:
        api = IndexApi(
            self.index,
            self.hasher,
            token=self.config.token,
            routed_ttl_s=self.config.routed_ttl_s,
            status=feed.status,
            max_tokens=self.config.max_request_tokens,
            max_body_bytes=self.config.max_body_bytes,
        )

        def listening(url: str) -> None:
            self.url = url
            if ready is not None:
                ready(self)

        assert feed.task is not None
        await serve(api.app(), sock, self.config.host, listening, alongside=feed.task)

"""`exact-index` through the broker: kvscope's index fed from Kafka while the fleet runs.

With `kvscope simulate --bootstrap-servers B --routing exact-index`, the engines' records go
to Kafka through the real publisher and a `PrefixIndex` reads them back with the index's
own Kafka reader (`kvscope.index.feed.IndexFeed`), as `kvscope index` does. The reader runs
on an event loop in a thread of its own; every call into the index runs on that loop, so
the index is never touched from two threads.

Simulated time runs far ahead of the broker, and the index must hold exactly what was
published up to the decision's time minus the lag, not what the reader fetched since. So
the reader's index (`HeldIndex`) keeps what it reads aside; before a decision the router
names the records due (`apply_all`): this waits until the reader read, per source, the last
of them (its seq under the run's epoch), then applies what was read up to there. The feed
starts at the topic's end and forgets what it read before getting there: records of
earlier runs (the same seed gives the same epochs and seqs) would otherwise pass for this
run's. (The end a broker reports can fall short of the last record: the local broker's did
by a batch.)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from kvscope.common.kafka import KafkaSettings
from kvscope.index.errors import IndexServiceError
from kvscope.index.feed import IndexFeed
from kvscope.index.protocol import ScoreResult
from kvscope.index.state import PrefixIndex
from kvscope.schemas import Envelope, Stream, topic_for

log = logging.getLogger(__name__)

T = TypeVar("T")
WAIT_S = 60.0
"""Longest wait for the reader to apply what was published (the publisher lingers, a new
topic's partitions are found within the reader's 10 s check)."""
POLL_S = 0.002
"""How often a wait looks at the index again."""


SourceKey = tuple[str, int]
"""(instance, dp_rank)."""


class HeldIndex(PrefixIndex):
    """A `PrefixIndex` that keeps the records its reader hands it until they are released."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[SourceKey, deque[Envelope]] = defaultdict(deque)
        self.read_to: dict[SourceKey, tuple[int, int]] = {}
        """Per source: (epoch, seq) of the last record read."""

    def apply_all(self, envelopes: Iterable[Envelope]) -> None:
        """Keep the records read (the reader calls this), in order per source."""
        for env in envelopes:
            key = (env.source.instance, env.source.dp_rank)
            self.held[key].append(env)
            self.read_to[key] = (env.epoch, env.seq)

    def release(self, due: dict[SourceKey, tuple[int, int]]) -> None:
        """Apply, per source, the records read up to (epoch, seq)."""
        ready: list[Envelope] = []
        for key, (epoch, seq) in due.items():
            held = self.held[key]
            while held and (held[0].epoch != epoch or held[0].seq <= seq):
                ready.append(held.popleft())
        super().apply_all(ready)


class BrokerIndex:
    """A `PrefixIndex` fed from the kv-events topic; `close()` stops its reader and thread."""

    def __init__(self, kafka: KafkaSettings, topic_prefix: str, wait_s: float = WAIT_S) -> None:
        self.index = HeldIndex()
        self.topic = topic_for(Stream.KV_EVENTS, topic_prefix)
        self.wait_s = wait_s
        self._kafka = kafka
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kvscope-sim-index", daemon=True
        )
        self._thread.start()
        self._feed: IndexFeed | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self._call(self._start())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self) -> None:
        positions = await self._end_offsets()
        self._feed = IndexFeed(self.index, self._kafka, self.topic, positions)
        try:
            await self._feed.start()
        except Exception as exc:
            raise IndexServiceError(
                f"the index cannot read {self.topic} from Kafka at "
                f"{self._kafka.bootstrap_servers}: {exc}"
            ) from exc
        self._task = asyncio.ensure_future(self._feed.run())
        if positions:  # the topic holds records: read past what its end said, then forget them
            try:
                await asyncio.wait_for(self._feed.caught_up.wait(), self.wait_s)
            except TimeoutError:
                raise IndexServiceError(
                    f"the index did not reach the end of {self.topic} in {self.wait_s:g} s"
                ) from None
            self.index = HeldIndex()
            self._feed.index = self.index

    async def _end_offsets(self) -> dict[int, int]:
        """partition -> end offset of the topic as it is now (none if it does not exist)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._kafka.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            **self._kafka.security_kwargs(),
        )
        try:
            await consumer.start()
            # as the index's reader does: the public call only knows subscribed topics
            cluster = await consumer._client.fetch_all_metadata()
            partitions = cluster.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            ends = await consumer.end_offsets(tps) if tps else {}
        except Exception as exc:
            raise IndexServiceError(
                f"cannot reach Kafka at {self._kafka.bootstrap_servers} for the index: {exc}"
            ) from exc
        finally:
            await consumer.stop()
        return {tp.partition: offset for tp, offset in ends.items()}

    def apply_all(self, envelopes: Iterable[Envelope]) -> None:
        """Wait until the reader read these records (published to Kafka), then apply what
        it read of their sources up to them."""
        due: dict[SourceKey, tuple[int, int]] = {}
        for env in envelopes:
            due[(env.source.instance, env.source.dp_rank)] = (env.epoch, env.seq)
        if due:
            self._call(self._wait(due))

    async def _wait(self, due: dict[SourceKey, tuple[int, int]]) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            missing = []
            for (instance, dp_rank), (epoch, seq) in due.items():
                read = self.index.read_to.get((instance, dp_rank))
                if read is None or read[0] != epoch or read[1] < seq:
                    missing.append(f"{instance}/{dp_rank} seq {seq}")
            if not missing:
                self.index.release(due)
                return
            if self._task is not None and self._task.done():
                self._task.result()  # the reader failed: raise its error
            if time.monotonic() > deadline:
                raise IndexServiceError(
                    f"the index read nothing of {', '.join(missing[:3])} from {self.topic} in "
                    f"{self.wait_s:g} s: check that Kafka at {self._kafka.bootstrap_servers} "
                    "takes the records (kvscope simulate reports lost records)"
                )
            await asyncio.sleep(POLL_S)

    def score(self, block_hashes: Sequence[int], *, now: float | None = None) -> ScoreResult:
        """The index's answer, computed on the reader's loop."""

        async def score() -> ScoreResult:
            return self.index.score(block_hashes, now=now)

        return self._call(score())

    def close(self) -> None:
        """Stop the reader, its connection and the thread (safe to call twice)."""
        if not self._thread.is_alive():
            return
        if self._feed is not None:
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                log.debug("index reader stopped", exc_info=True)
        if self._feed is not None:
            await self._feed.stop()

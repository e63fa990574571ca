"""The demo's moving parts: collector (in this process), Kafka publisher, fleet simulator.

`Pipeline` is a context manager: leaving it, normally or by Ctrl-C, stops the simulator's
publisher and the collector. The broker and the chDB directory belong to `demo.run_demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from kvscope.collector.analytics.report.progress import StepProgress
from kvscope.collector.errors import PipelineError
from kvscope.collector.storage import tables
from kvscope.collector.storage.target import Target, connect

if TYPE_CHECKING:
    from kvscope.collector.local.demo_scales import DemoScale

log = logging.getLogger(__name__)

STORE_TIMEOUT_S = 90.0
"""How long to wait for the collector to store everything the fleet published."""
FLUSH_TIMEOUT_S = 30.0
SETTLE_S = 4.0
"""With an unknown record count: everything is stored once nothing new arrived this long."""
SLOW_FACTOR = 10.0
"""How much slower the demo's slow transfer pair is than the others."""

# One stored row per published envelope, except kv_block_events (one row per block hash).
_STORED_ENVELOPES = (
    f"SELECT (SELECT uniqExact(instance, dp_rank, epoch, seq) FROM {tables.KV_BLOCK_EVENTS.name})"
    f" + (SELECT count() FROM {tables.ENGINE_STATS.name})"
    f" + (SELECT count() FROM {tables.REQUESTS.name})"
    f" + (SELECT count() FROM {tables.KV_TRANSFERS.name})"
    f" + (SELECT count() FROM {tables.KV_ACCESSES.name})"
)


class _CollectorThread:
    """The collector service on its own event loop in a background thread."""

    def __init__(self, bootstrap_servers: str, target: Target, topic_prefix: str) -> None:
        from kvscope.collector.pipeline.config import CollectorConfig
        from kvscope.collector.pipeline.service import Collector

        self._loop = asyncio.new_event_loop()
        self._collector = Collector(
            CollectorConfig(
                bootstrap_servers=bootstrap_servers,
                target=target,
                group="kvscope-demo",
                topic_prefix=topic_prefix,
                batch_seconds=0.5,
                session_timeout_ms=6000,
                shutdown_timeout_s=10.0,
            )
        )
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvscope-demo-collector")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._collector.run())
        except BaseException as exc:  # reported by check() in the main thread
            log.exception("collector failed")
            self.error = exc
        finally:
            self._loop.close()

    def check(self) -> None:
        """Raise if the collector thread died."""
        if self.error is not None or not self._thread.is_alive():
            raise PipelineError(f"the collector stopped unexpectedly: {self.error!r}")

    def stop(self) -> None:
        """Ask the collector to flush, commit and leave; wait for it."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._collector.request_stop)
            self._thread.join(timeout=30)


class Pipeline:
    """Fleet simulator → Kafka publisher → broker → collector → ClickHouse, for the demo.

    Leaving the context (normally, on an error or on Ctrl-C) stops the publisher and the
    collector; the broker and the chDB directory belong to `demo.run_demo`.
    """

    def __init__(
        self, bootstrap_servers: str, target: Target, topic_prefix: str, progress: StepProgress
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.target = target
        self.topic_prefix = topic_prefix
        self.progress = progress
        self._collector: _CollectorThread | None = None
        self._sink: Any = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._sink is not None:
            self._sink.close(2.0)
            self._sink = None
        self.stop_collector()

    def simulate(self, scale: DemoScale, seed: int) -> int:
        """Publish a simulated fleet run through Kafka; return the number of records sent."""
        from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
        from kvscope.simulator.sinks import KafkaSink

        config = SimConfig(
            instances=parse_instances(scale.instances),
            workload="generated-shared-prefix",
            requests=scale.requests,
            rate=scale.rate,
            routing="round-robin",
            seed=seed,
            capacity_blocks=scale.capacity_blocks,
            slow_pair=scale.slow_pair,
            slow_factor=SLOW_FACTOR,
            # Simulated time ends about now, so the report's times read naturally.
            start_ts=round(time.time() - scale.requests / scale.rate - 5.0),
        )
        self._sink = KafkaSink(self.bootstrap_servers, self.topic_prefix)
        sent = 0

        def count_and_publish(source: Any, epoch: int, body: Any, ts: float) -> None:
            nonlocal sent
            self._sink(source, epoch, body, ts)
            sent += 1

        self.progress.step(f"simulating {len(config.instances)} engines", total=scale.requests)
        Fleet(config, count_and_publish, lambda done, _: self.progress.update(done)).run()
        self.progress.step("publishing to Kafka")
        if not self._sink.kafka.flush(FLUSH_TIMEOUT_S):
            raise PipelineError(
                f"the Kafka broker at {self.bootstrap_servers} did not acknowledge the records "
                f"within {FLUSH_TIMEOUT_S:.0f} s: is it running and reachable?"
            )
        return sent

    def collect(self, published: int | None) -> int:
        """Run the collector until it stored every published record; return how many are.

        With `published` None (real engines: the count is not known here) wait until the
        stored count has not changed for `SETTLE_S` seconds.
        """
        self.progress.step("collector: joining", total=published)
        self._collector = _CollectorThread(self.bootstrap_servers, self.target, self.topic_prefix)
        client = connect(self.target, create_database=False)
        try:
            deadline = time.monotonic() + STORE_TIMEOUT_S
            stored, changed_at = -1, time.monotonic()
            while True:
                now_stored = int(client.command(_STORED_ENVELOPES))
                if now_stored != stored:
                    stored, changed_at = now_stored, time.monotonic()
                self.progress.update(stored, "collector: storing")
                if published is not None and stored >= published:
                    break
                if published is None and stored and time.monotonic() - changed_at > SETTLE_S:
                    break
                self._collector.check()
                if time.monotonic() > deadline:
                    raise PipelineError(
                        f"the collector stored {stored:,} of {published or '?'} records in "
                        f"{STORE_TIMEOUT_S:.0f} s; run with --log-level DEBUG to see why"
                    )
                time.sleep(0.3)
        finally:
            client.close()
        self.stop_collector()
        return stored

    def stop_collector(self) -> None:
        """Stop the collector (flush, commit). Safe to call twice."""
        if self._collector is not None:
            self._collector.stop()
            self._collector = None

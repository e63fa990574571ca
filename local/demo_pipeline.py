"""The demo's moving parts: serve (collector + dashboard, in this process), Kafka publisher,
fleet simulator.

`Pipeline` is a context manager: leaving it, normally or by Ctrl-C, stops the simulator's
publisher and the collector. The broker and the chDB directory belong to `demo.run_demo`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvscope.analytics.report.progress import StepProgress
from kvscope.collector.errors import PipelineError
from kvscope.collector.storage import tables
from kvscope.collector.storage.target import Target, connect
from kvscope.schemas.errors import KvscopeError

if TYPE_CHECKING:
    from kvscope.local.demo_scales import DemoScale

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


class _ServeThread:
    """`kvscope serve` (collector + HTTP API + dashboard) in a background thread."""

    def __init__(self, bootstrap_servers: str, target: Target, topic_prefix: str, port: int):
        from kvscope.collector.pipeline.config import CollectorConfig
        from kvscope.serve.service import Serve, ServeOptions

        self._serve = Serve(
            CollectorConfig(
                bootstrap_servers=bootstrap_servers,
                target=target,
                group="kvscope-demo",
                topic_prefix=topic_prefix,
                batch_seconds=0.5,
                session_timeout_ms=6000,
                shutdown_timeout_s=10.0,
            ),
            ServeOptions(port=port),
        )
        self.error: BaseException | None = None
        self._ready = threading.Event()
        # A daemon: a Ctrl-C while chDB is still opening must not keep the process alive.
        self._thread = threading.Thread(target=self._run, name="kvscope-demo-serve", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._serve.run(on_ready=lambda _: self._ready.set(), signals=False)
        except BaseException as exc:  # reported by check() in the main thread
            if not isinstance(exc, KvscopeError):  # ours are one line, said by check()
                log.exception("serve failed")
            self.error = exc
        finally:
            self._ready.set()

    def url(self, timeout_s: float = 60.0) -> str:
        """The dashboard's URL once the serve listens (raises if it failed)."""
        self._ready.wait(timeout_s)
        self.check()
        if self._serve.url is None:
            raise PipelineError(f"the dashboard did not start within {timeout_s:.0f} s")
        return self._serve.url

    def check(self) -> None:
        """Raise if the serve thread died."""
        if isinstance(self.error, KvscopeError):
            raise self.error
        if self.error is not None or not self._thread.is_alive():
            raise PipelineError(f"the collector stopped unexpectedly: {self.error!r}")

    def stop(self) -> None:
        """Ask the collector to flush, commit and leave, and the listener to close; wait."""
        if self._thread.is_alive():
            self._serve.request_stop()
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
        self._collector: _ServeThread | None = None
        self._sink: Any = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._sink is not None:
            self._sink.close(2.0)
            self._sink = None
        self.stop_collector()

    def simulate(
        self,
        scale: DemoScale,
        seed: int,
        pace: float | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> int:
        """Publish a simulated fleet run through Kafka; return the number of records sent.

        With `pace` (simulated seconds per wall second) records go out when their time is
        due and carry timestamps up to now (see `pacing`); the first Ctrl-C then ends the
        publishing early, and what was published is still flushed, so the demo stores it
        and writes the report. `notice(text)` gets a progress line every few seconds.
        Without a pace the fleet publishes as fast as the broker takes it.
        """
        from kvscope.analytics.times import whole_minute_before
        from kvscope.local.pacing import (
            PacedSink,
            PublishingStopped,
            clock_hms,
            interrupts_stop,
            paced_start_ts,
        )
        from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
        from kvscope.simulator.sinks import KafkaSink

        span_s = scale.requests / scale.rate
        now = time.time()
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
            # Simulated time ends about now, so the report's times read naturally; it starts
            # at a whole minute, so one seed gives the same per-minute series every time.
            start_ts=whole_minute_before(now - span_s - 5.0)
            if pace is None
            else paced_start_ts(now, span_s, pace),
        )
        self._sink = KafkaSink(self.bootstrap_servers, self.topic_prefix)
        sent = 0

        def count_and_publish(source: Any, epoch: int, body: Any, ts: float) -> None:
            nonlocal sent
            self._sink(source, epoch, body, ts)
            sent += 1

        engines = len(config.instances)
        if pace is None:
            self.progress.step(f"simulating {engines} engines", total=scale.requests)
            Fleet(config, count_and_publish, lambda done, _: self.progress.update(done)).run()
        else:
            say = notice or log.info

            def report(simulated_s: float, published: int) -> None:
                say(
                    f"publishing: simulated {clock_hms(simulated_s)} of about "
                    f"{clock_hms(span_s)}, {published:,} records published"
                )

            paced = PacedSink(count_and_publish, pace, config.start_ts, report)
            self.progress.step(f"publishing {engines} engines live ({pace:g}x)", scale.requests)
            try:
                with interrupts_stop(paced.stop):
                    Fleet(config, paced, lambda done, _: self.progress.update(done)).run()
            except PublishingStopped:
                say(
                    f"stopped publishing at simulated {clock_hms(paced.simulated_s)} after "
                    f"{sent:,} records; storing them and writing the report (Ctrl-C again "
                    "to abort)"
                )
        self.progress.step("publishing to Kafka")
        if not self._sink.kafka.flush(FLUSH_TIMEOUT_S):
            raise PipelineError(
                f"the Kafka broker at {self.bootstrap_servers} did not acknowledge the records "
                f"within {FLUSH_TIMEOUT_S:.0f} s: is it running and reachable?"
            )
        return sent

    def collect(self, published: int | None) -> int:
        """Wait until the collector stored every published record; return how many are.

        The collector (and the dashboard) keep running until the pipeline is left.

        With `published` None (real engines: the count is not known here) wait until the
        stored count has not changed for `SETTLE_S` seconds.
        """
        self.progress.step("collector: joining", total=published)
        self.serve(0)
        assert self._collector is not None
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
        return stored

    def serve(self, port: int) -> str:
        """Start the collector and the dashboard (once) on `port` (0: any); the URL."""
        if self._collector is None:
            self._collector = _ServeThread(
                self.bootstrap_servers, self.target, self.topic_prefix, port
            )
        return self._collector.url()

    def stop_collector(self) -> None:
        """Stop the collector (flush, commit). Safe to call twice."""
        if self._collector is not None:
            self._collector.stop()
            self._collector = None

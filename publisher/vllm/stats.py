"""`KvscopeStatLogger`: vLLM engine stats, finished requests and KV-connector transfers to Kafka.

Loaded by `vllm serve` through the `vllm.stat_logger_plugins` entry point, or passed as
`LLMEngine(..., stat_loggers=[KvscopeStatLogger])`. vLLM calls `record()` once per engine
step in the front-end process, one logger per engine (dp rank). It publishes:
- one `EngineStats` every `KVSCOPE_STATS_INTERVAL_S` seconds of activity (prefix-cache token
  queries and hits and preemptions as deltas over the interval; capacity, usage, running,
  waiting as of its end), checked at every step and at vLLM's periodic `log()` call (every
  `VLLM_LOG_STATS_INTERVAL`, also while idle), plus the tail at process exit. Capacity is
  the engine's `num_gpu_blocks` as last seen while the engine ran: vLLM sets it to `None`
  once the engine core shuts down, so the tail would otherwise report 0 blocks;
- one `RequestFinished` per finished request (vLLM's own cached-token count);
- one `KVTransfer` per transfer the KV connector reports (NIXL, Mooncake), unless the
  connector is kvscope's `KvscopeConnector`, which publishes one per request itself
  (with request id and peer, which the connector's stats lack).
Does nothing unless kvscope is on for the engine: `--kv-events-config` with
`"publisher": "kvscope"` (the one switch), else `KVSCOPE_BOOTSTRAP_SERVERS`. Never raises into vLLM.
"""

from __future__ import annotations

import atexit
import logging
import time
from typing import Any

from kvscope.publisher.base import NullPublisher, Publisher
from kvscope.publisher.kafka import shared_kafka_publisher
from kvscope.publisher.vllm.connector.plans import WRAPPER_NAME
from kvscope.publisher.vllm.convert import (
    backend_name,
    request_from_vllm,
    transfers_from_connector_stats,
)
from kvscope.publisher.vllm.source import served_model_name, vllm_source
from kvscope.publisher.vllm.switch import engine_config
from kvscope.schemas import EngineStats
from kvscope.schemas.streams import Stream
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase

log = logging.getLogger(__name__)
_REQUESTS = Stream.REQUESTS.value
_MAX_UNFOLDED_STEPS = 4096
"""Steps kept before they are folded even if the interval is not over (bounds memory)."""


class KvscopeStatLogger(StatLoggerBase):
    """A vLLM stat logger publishing kvscope's engine-stats, requests and kv-transfers streams."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self._config = engine_config(vllm_config)
        self._cache = vllm_config.cache_config
        self._capacity = self._cache.num_gpu_blocks or 0
        transfer = vllm_config.kv_transfer_config
        self._backend = backend_name(str(transfer.kv_connector or "")) if transfer else ""
        self._per_request = transfer is not None and transfer.kv_connector == WRAPPER_NAME
        self._publisher: Publisher = NullPublisher()
        self._source = vllm_source(
            self._config,
            dp_rank=engine_index,
            model=served_model_name(vllm_config),
        )
        if self._config.enabled:
            self._publisher = shared_kafka_publisher(self._config).for_source(self._source)
        self._started = time.monotonic()
        self._queries = self._hits = self._preemptions = 0
        self._running = self._waiting = 0
        self._usage = 0.0
        self._dirty = False
        self._steps: list[Any] = []
        atexit.register(self.shutdown)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Fold one engine step into the interval; publish what is due."""
        try:
            if iteration_stats is not None:
                self._preemptions += iteration_stats.num_preempted_reqs
                ts = iteration_stats.iteration_timestamp
                for finished in iteration_stats.finished_requests:  # converted by the sender
                    self._publisher.publish_raw(_REQUESTS, finished, ts, request_from_vllm)
                self._dirty = True
            if scheduler_stats is not None:
                steps = self._steps
                steps.append(scheduler_stats)
                publishes_transfers = scheduler_stats.kv_connector_stats and not self._per_request
                if publishes_transfers or len(steps) >= _MAX_UNFOLDED_STEPS:
                    self._fold_steps()
            self._flush_if_due()
        except Exception:
            log.warning("kvscope stat logger failed on a step; continuing", exc_info=True)

    def log(self) -> None:
        """vLLM's periodic hook (also while idle): publish the interval if it is due."""
        try:
            self._flush_if_due()
        except Exception:
            log.warning("kvscope stat logger failed to publish stats; continuing", exc_info=True)

    def _flush_if_due(self) -> None:
        if (self._dirty or self._steps) and (
            time.monotonic() - self._started >= self._config.stats_interval_s
        ):
            self.flush()

    def _fold_steps(self) -> None:
        """Fold the steps kept since the last fold into the interval's counts and gauges.

        `record()` only keeps each step's stats (one list append on the engine's step
        path); they are folded here, at the interval's end, in one warm loop, or at once
        when a step carries KV-connector transfers this logger publishes (they keep their
        step's time)."""
        steps, self._steps = self._steps, []
        if not steps:
            return
        self._capacity = self._cache.num_gpu_blocks or self._capacity
        for stats in steps:
            prefix = stats.prefix_cache_stats
            self._queries += prefix.queries
            self._hits += prefix.hits
            if stats.kv_connector_stats and not self._per_request:
                self._publish_transfers(stats.kv_connector_stats)
        last = steps[-1]
        self._running = last.num_running_reqs
        self._waiting = last.num_waiting_reqs + last.num_skipped_waiting_reqs
        self._usage = min(1.0, max(0.0, float(last.kv_cache_usage)))
        self._dirty = True

    def _publish_transfers(self, connector_stats: Any) -> None:
        """One `KVTransfer` per transfer the KV connector reported in a step."""
        source, role = self._source.instance, self._config.role
        transfers = transfers_from_connector_stats(connector_stats, self._backend, source, role)
        for transfer in transfers:
            self._publisher.publish(transfer)

    def flush(self) -> None:
        """Publish the interval so far as one `EngineStats` and start the next one."""
        self._fold_steps()
        now = time.monotonic()
        self._publisher.publish(
            EngineStats(
                capacity_blocks=self._capacity,
                block_size=self._cache.block_size,
                usage=self._usage,
                running=self._running,
                waiting=self._waiting,
                prefix_queries_delta=self._queries,
                prefix_hits_delta=self._hits,
                preemptions_delta=self._preemptions,
                interval_s=now - self._started,
            )
        )
        self._started = now
        self._queries = self._hits = self._preemptions = 0
        self._dirty = False

    def log_engine_initialized(self) -> None:
        """vLLM's hook once the engine is up: note its capacity, say where kvscope publishes."""
        self._capacity = self._cache.num_gpu_blocks or self._capacity
        if self._config.enabled:
            log.info(
                "kvscope: engine stats every %.1fs for %s",
                self._config.stats_interval_s,
                self._source.key,
            )

    def shutdown(self) -> None:
        """Publish the last interval (registered to run at process exit as well)."""
        if self._dirty or self._steps:
            self.flush()

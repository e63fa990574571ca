"""`KvscopeConnector`: a vLLM v1 KV connector that wraps another one and times its loads.

Loaded the supported way, through `kv_connector_module_path`; the wrapped connector is
named in `kv_connector_extra_config["inner"]` (a `KVTransferConfig` subset, as vLLM's own
`MultiConnector` names its children):

    --kv-transfer-config '{"kv_connector": "KvscopeConnector",
      "kv_connector_module_path": "kvscope.publisher.vllm.connector",
      "kv_role": "kv_consumer", "engine_id": "decode-0", "kv_buffer_device": "cpu",
      "kv_connector_extra_config": {"inner": {"kv_connector": "NixlConnector",
        "kv_connector_extra_config": {"num_threads": 1}}}}'

Every method and classmethod of `KVConnectorBase_V1` (and `SupportsHMA`) is forwarded
to the inner connector, which sees its own config as if it had been named directly
(engine id, role and buffer device come from the outer config). On top of that:

- scheduler side (engine-core process): a request whose load the inner connector
  accepts (`update_state_after_alloc` with external tokens) becomes a `LoadPlan`: the
  peer (the `kvscope_instance` the prefill wrapper put into `kv_transfer_params`, else
  `remote_engine_id`), the blocks allocated for the loaded tokens and their bytes (KV
  bytes per block from the KV cache config). Plans ride to the workers inside this
  connector's metadata. The prefill side adds its own kvscope instance to the
  `kv_transfer_params` the inner connector returns from `request_finished`, which a P/D
  proxy hands to the decode request unchanged.
- worker side: `LoadTracker` times each planned load from the `start_load_kv` that
  issues it to the `get_transfer_results` that reports it received, and publishes one
  `KVTransfer` per request (status failed on `failed_recving` or a load error in one of
  its blocks) from tensor-parallel rank 0, directly to Kafka through the process's shared
  publisher: records leave the worker without riding vLLM's stats path, whose payload
  vLLM aggregates and logs as connector-specific stats.

- `"nixl_progress_delay_us": N` in this connector's own `kv_connector_extra_config` lets
  NIXL's progress thread sleep up to N µs between polls instead of spinning a core
  (`nixl_progress`); for hosts with few cores.

The inner connector's stats are passed on as a `MultiKVConnectorStats` keyed by the inner
connector's name, so vLLM's logging, Prometheus metrics and kvscope's stat logger read
them as they read `MultiConnector`'s. Nothing kvscope does raises into vLLM; errors of the
inner connector propagate unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.publisher.base import NullPublisher, Publisher
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import shared_kafka_publisher
from kvscope.publisher.vllm.connector.inner import (
    INNER_KEY,
    bytes_per_block,
    class_by_key,
    inner_config,
    inner_key,
    inner_key_of,
)
from kvscope.publisher.vllm.connector.plans import LoadPlan
from kvscope.publisher.vllm.connector.scheduler import LoadPlanner
from kvscope.publisher.vllm.connector.worker import LoadTracker, is_first_tp_rank, worker_tracker
from kvscope.publisher.vllm.convert import backend_name
from kvscope.publisher.vllm.nixl_progress import progress_delay_us, set_progress_delay
from kvscope.publisher.vllm.source import served_model_name, vllm_source
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    CopyBlocksOp,
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
    supports_hma,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorPromMetrics,
    MultiKVConnectorStats,
)

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT_S = 5.0


@dataclass
class KvscopeConnectorMetadata(KVConnectorMetadata):
    """The inner connector's metadata for this step plus the loads it plans."""

    inner: KVConnectorMetadata
    loads: tuple[LoadPlan, ...] = ()


class KvscopeConnector(KVConnectorBase_V1, SupportsHMA):
    """Forwards everything to the connector in `extra_config["inner"]`; times its loads."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = inner_config(vllm_config)
        assert vllm_config.kv_transfer_config is not None
        delay_us = progress_delay_us(vllm_config.kv_transfer_config.kv_connector_extra_config)
        if delay_us is not None and role is KVConnectorRole.WORKER:
            set_progress_delay(delay_us)
        assert config.kv_transfer_config is not None
        inner_cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        self._inner: KVConnectorBase_V1 = inner_cls(config, role, kv_cache_config)
        if (
            not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
            and not supports_hma(self._inner)
            and len(kv_cache_config.kv_cache_groups) > 1
        ):
            raise ValueError(
                f"{inner_cls.__name__} does not support the hybrid KV cache manager; "
                "start vLLM with --disable-hybrid-kv-cache-manager"
            )
        self._stats_key = inner_key(config.kv_transfer_config)
        self._publisher: Publisher = NullPublisher()
        self._loads: tuple[LoadPlan, ...] = ()
        self._tracker: LoadTracker | None = None
        publisher_config = PublisherConfig.from_env().validate()
        source = vllm_source(
            publisher_config,
            dp_rank=vllm_config.parallel_config.data_parallel_rank,
            model=served_model_name(vllm_config),
        )
        self._planner = LoadPlanner(
            source.instance, vllm_config.cache_config.block_size, bytes_per_block(kv_cache_config)
        )
        if role is KVConnectorRole.WORKER and is_first_tp_rank():
            if publisher_config.enabled:
                self._publisher = shared_kafka_publisher(publisher_config).for_source(source)
            backend = backend_name(str(config.kv_transfer_config.kv_connector))
            self._tracker = worker_tracker(self._publisher, backend, source.instance)

    @property
    def inner(self) -> KVConnectorBase_V1:
        """The wrapped connector."""
        return self._inner

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """The inner connector's answer."""
        return self._inner.supports_divergent_local_hybrid_hits

    @property
    def requires_kv_delivery(self) -> bool:
        """The inner connector's answer."""
        return self._inner.requires_kv_delivery

    # ---- worker side ----

    def get_mem_pool_context(self) -> AbstractContextManager[Any] | None:
        """Forwarded."""
        return self._inner.get_mem_pool_context()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Bind the inner connector's part; keep the planned loads for `start_load_kv`."""
        if isinstance(connector_metadata, KvscopeConnectorMetadata):
            self._loads = connector_metadata.loads
            self._inner.bind_connector_metadata(connector_metadata.inner)
        else:
            self._inner.bind_connector_metadata(connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        """Forwarded."""
        self._loads = ()
        self._inner.clear_connector_metadata()
        super().clear_connector_metadata()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Forwarded."""
        self._inner.register_kv_caches(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp) -> None:
        """Forwarded."""
        self._inner.set_host_xfer_buffer_ops(copy_operation)

    def finish_forward(self) -> None:
        """Forwarded."""
        self._inner.finish_forward()

    def reset_capture_state(self) -> None:
        """Forwarded."""
        self._inner.reset_capture_state()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Forwarded (the inner connector's part of the metadata)."""
        if isinstance(kv_connector_metadata, KvscopeConnectorMetadata):
            kv_connector_metadata = kv_connector_metadata.inner
        self._inner.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start timing this step's planned loads, then let the inner connector issue them."""
        if self._tracker is not None and self._loads:
            self._tracker.started(self._loads)
        self._loads = ()
        self._inner.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Forwarded."""
        self._inner.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Forwarded."""
        self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        """Forwarded."""
        self._inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Forwarded (vLLM calls `get_transfer_results`, which is what is timed)."""
        return self._inner.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """The inner connector's results; received loads stop their timers."""
        results = self._inner.get_transfer_results(finished_req_ids)
        if self._tracker is not None:
            self._tracker.finished(results.finished_recving, results.failed_recving)
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The inner connector's load errors; loads with failed blocks are reported failed."""
        errors = self._inner.get_block_ids_with_load_errors()
        if self._tracker is not None:
            self._tracker.load_errors(errors)
        return errors

    def shutdown(self) -> None:
        """Shut the inner connector down, then deliver kvscope's queue within a deadline."""
        try:
            self._inner.shutdown()
        finally:
            self._publisher.shutdown(_SHUTDOWN_TIMEOUT_S)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The inner connector's stats, keyed by its name (`MultiConnector`'s format)."""
        stats = self._inner.get_kv_connector_stats()
        if stats is None:
            return None
        return MultiKVConnectorStats(data={self._stats_key: stats})

    def get_kv_connector_kv_cache_events(self) -> Any:
        """Forwarded."""
        return self._inner.get_kv_connector_kv_cache_events()

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """Forwarded."""
        return self._inner.get_handshake_metadata()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        """Forwarded."""
        return self._inner.build_connector_worker_meta()

    def get_finished_count(self) -> int | None:
        """Forwarded."""
        return self._inner.get_finished_count()

    def set_xfer_handshake_metadata(
        self, metadata: dict[int, KVConnectorHandshakeMetadata]
    ) -> None:
        """Forwarded."""
        self._inner.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        """Forwarded."""
        self._inner.set_xfer_handshake_metadata_pp_aware(metadata)

    # ---- scheduler side ----

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        """Forwarded."""
        self._kv_cache_manager = kv_cache_manager
        self._inner.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """Forwarded."""
        self._inner.bind_gpu_block_pool(gpu_block_pool)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """Forwarded."""
        return self._inner.get_loaded_kv_cache_group_ids(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Forwarded; remembers the locally computed tokens a load would follow."""
        self._planner.matched(request.request_id, num_computed_tokens)
        return self._inner.get_num_new_matched_tokens(request, num_computed_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[Any, int]:
        """Forwarded."""
        return self._inner.get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Forwarded; a load of external tokens becomes a `LoadPlan` for the workers."""
        self._inner.update_state_after_alloc(request, blocks, num_external_tokens)
        self._planner.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """The inner connector's metadata with the loads planned this step."""
        return KvscopeConnectorMetadata(
            inner=self._inner.build_connector_meta(scheduler_output), loads=self._planner.take()
        )

    def on_new_request(self, request: Request) -> None:
        """Forwarded."""
        self._inner.on_new_request(request)

    def update_connector_output(self, connector_output: Any) -> None:
        """Forwarded."""
        self._inner.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forwarded; returned `kv_transfer_params` also name this kvscope instance."""
        self._planner.forget(request.request_id)
        delay, params = self._inner.request_finished(request, block_ids)
        return delay, self._planner.with_instance(params)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forwarded (to `request_finished` when the inner connector has no HMA support)."""
        if not supports_hma(self._inner):
            return self.request_finished(request, block_ids[0])
        self._planner.forget(request.request_id)
        delay, params = self._inner.request_finished_all_groups(request, block_ids)  # type: ignore[attr-defined]
        return delay, self._planner.with_instance(params)

    def register_finished_partial_tail(
        self,
        request: Request,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        """Forwarded."""
        return self._inner.register_finished_partial_tail(request, block_ids, partial_tail_offloads)

    def take_events(self) -> Iterable[Any]:
        """Forwarded."""
        return self._inner.take_events()

    def has_pending_block_frees(self) -> bool:
        """Forwarded."""
        return self._inner.has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        """Forwarded."""
        return self._inner.has_pending_push_work()

    def reset_cache(self) -> bool | None:
        """Forwarded."""
        return self._inner.reset_cache()

    # ---- classmethods: resolved from the config the engine passes ----

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The inner connector's required layout."""
        config = inner_config(vllm_config)
        assert config.kv_transfer_config is not None
        inner_cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        return inner_cls.get_required_kvcache_layout(config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """The inner connector's answer for its own extra config."""
        inner = (extra_config or {}).get(INNER_KEY) or {}
        key = inner_key_of(inner.get("kv_connector"), inner.get("kv_connector_module_path"))
        return class_by_key(key).requires_piecewise_for_cudagraph(
            inner.get("kv_connector_extra_config") or {}
        )

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        """`{inner name: stats}` rebuilt with the inner connector's own stats class."""
        if data is None:
            return MultiKVConnectorStats()
        rebuilt: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, KVConnectorStats):
                rebuilt[key] = value
            elif (stats := class_by_key(key).build_kv_connector_stats(data=value)) is not None:
                rebuilt[key] = stats
        return MultiKVConnectorStats(data=rebuilt)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        """The inner connector's metrics, observing its part of the keyed stats."""
        config = inner_config(vllm_config)
        assert config.kv_transfer_config is not None
        inner_cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        metrics = inner_cls.build_prom_metrics(
            config, metric_types, labelnames, per_engine_labelvalues
        )
        if metrics is None:
            return None
        return MultiKVConnectorPromMetrics(
            vllm_config,
            metric_types,
            labelnames,
            per_engine_labelvalues,
            {inner_key(config.kv_transfer_config): metrics},
        )

"""vLLM `EventPublisher`s of the plugin: the tee (ZMQ and kvscope's in-engine Kafka
publisher) and the sidecar (ZMQ alone, forwarded to Kafka by a supervised bridge child).

Imported only inside vLLM processes (they subclass vLLM's `EventPublisher`).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import SourcePublisher, shared_kafka_publisher
from kvscope.publisher.vllm.convert import kv_batch_from_vllm
from kvscope.publisher.vllm.sidecar import (
    BridgeSupervisor,
    bridge_command,
    check_bindable,
    dp_endpoint,
    local_url,
)
from kvscope.publisher.vllm.source import served_model_name, vllm_source
from kvscope.publisher.vllm.switch import parse_endpoint
from kvscope.schemas import ConfigError
from vllm.distributed.kv_events import (
    EventBatch,
    EventPublisher,
    NullEventPublisher,
    ZmqEventPublisher,
)

log = logging.getLogger(__name__)
_SHUTDOWN_TIMEOUT_S = 5.0


def _served_model_name(max_frames: int = 6) -> str:
    """The served model name of the vLLM component constructing the publisher, else "".

    vLLM's factory passes only the KV-events config; the caller (the scheduler) holds the
    full `vllm_config`. Read it from the calling frames (read-only, best effort);
    `KVSCOPE_MODEL` overrides it.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            break
        vllm_config = getattr(frame.f_locals.get("self"), "vllm_config", None)
        if vllm_config is not None:
            return served_model_name(vllm_config)
        frame = frame.f_back
    return ""


class _AroundZmq(EventPublisher):
    """vLLM's ZMQ publisher with kvscope's part after it: on shutdown ZMQ stops first (its
    thread sends what is queued), then kvscope's part (`_stop_kvscope`) within a deadline."""

    def __init__(self, inner: EventPublisher) -> None:
        super().__init__(inner._data_parallel_rank)
        self._inner = inner

    def shutdown(self) -> None:
        """Stop ZMQ, then kvscope's part within `_SHUTDOWN_TIMEOUT_S`."""
        try:
            self._inner.shutdown()
        finally:
            self._stop_kvscope(_SHUTDOWN_TIMEOUT_S)

    def _stop_kvscope(self, timeout_s: float) -> None:
        raise NotImplementedError

    def get_publisher_config(self) -> Any:
        """The ZMQ publisher's resolved config (vLLM reports it to clients)."""
        return self._inner.get_publisher_config()


class KvscopeTeePublisher(_AroundZmq):
    """vLLM's own publisher first (ZMQ, unchanged), then kvscope's (never blocks or raises)."""

    def __init__(
        self, inner: EventPublisher, kvscope: SourcePublisher, keep_token_ids: bool
    ) -> None:
        super().__init__(inner)
        self._kvscope = kvscope
        self._convert = functools.partial(kv_batch_from_vllm, keep_token_ids=keep_token_ids)

    def publish(self, events: EventBatch) -> None:
        """Hand the batch to ZMQ, then queue it for Kafka (converted on the sender thread)."""
        self._inner.publish(events)
        self._kvscope.publish_raw("kv-events", events, events.ts, self._convert)

    def _stop_kvscope(self, timeout_s: float) -> None:
        """Deliver kvscope's queue within the deadline."""
        self._kvscope.shutdown(timeout_s)


def tee_constructor(
    inner: Callable[..., EventPublisher], config: PublisherConfig
) -> Callable[..., EventPublisher]:
    """A registry constructor building `inner` and teeing it into kvscope."""

    def construct(data_parallel_rank: int = 0, **kwargs: Any) -> EventPublisher:
        zmq_publisher = inner(data_parallel_rank=data_parallel_rank, **kwargs)
        return _tee(zmq_publisher, config, data_parallel_rank)

    return construct


def _tee(zmq_publisher: EventPublisher, config: PublisherConfig, rank: int) -> EventPublisher:
    """`zmq_publisher` teed into kvscope's shared Kafka publisher for dp rank `rank`."""
    source = vllm_source(config, dp_rank=rank, model=_served_model_name())
    kvscope = shared_kafka_publisher(config).for_source(source)
    return KvscopeTeePublisher(zmq_publisher, kvscope, config.forward_token_ids)


def kvscope_constructor(data_parallel_rank: int = 0, **kwargs: Any) -> EventPublisher:
    """The `kvscope` entry of vLLM's publisher registry (`"publisher": "kvscope"`).

    Settings come from the `kafka://` endpoint (`kvscope.publisher.vllm.switch`); vLLM's
    ZMQ publisher runs beside it when the endpoint names one (`?zmq=tcp://*:5557`), with
    the rest of `--kv-events-config` (replay endpoint, hwm, topic) as vLLM reads it.
    Raises `ConfigError` at engine start for a bad endpoint or for sidecar mode, which
    needs `"publisher": "zmq"` (the bridge child subscribes to vLLM's own socket).
    """
    switch = parse_endpoint(kwargs.pop("endpoint", ""))
    if switch.config.kv_events_sidecar:
        raise ConfigError(
            'sidecar mode forwards vLLM\'s ZMQ events: use "publisher": "zmq" with '
            "KVSCOPE_BOOTSTRAP_SERVERS and KVSCOPE_KV_EVENTS_SIDECAR=1"
        )
    zmq_publisher: EventPublisher = NullEventPublisher(data_parallel_rank)
    if switch.zmq_endpoint:
        zmq_publisher = ZmqEventPublisher(
            data_parallel_rank=data_parallel_rank, endpoint=switch.zmq_endpoint, **kwargs
        )
    log.info(
        "kvscope: vLLM KV events go to Kafka at %s (ZMQ %s)",
        switch.config.bootstrap_servers,
        switch.zmq_endpoint or "off",
    )
    return _tee(zmq_publisher, switch.config, data_parallel_rank)


class KvscopeSidecarPublisher(_AroundZmq):
    """vLLM's ZMQ publisher as it is, plus the bridge child that forwards what it publishes.

    `publish` is the ZMQ publisher's own bound method (set on the instance), so the engine
    does exactly the work it does without kvscope. `shutdown()` stops ZMQ first (its
    thread sends what is queued), then the child (SIGTERM: it delivers its queue to Kafka).
    """

    def __init__(self, inner: EventPublisher, supervisor: BridgeSupervisor) -> None:
        super().__init__(inner)
        self.supervisor = supervisor
        self.publish = inner.publish  # type: ignore[method-assign]

    def publish(self, events: EventBatch) -> None:
        """vLLM's ZMQ publish (shadowed by the instance attribute set in `__init__`)."""
        self._inner.publish(events)

    def _stop_kvscope(self, timeout_s: float) -> None:
        """SIGTERM the bridge child, SIGKILL it after the deadline."""
        self.supervisor.stop(timeout_s)


def sidecar_constructor(
    inner: Callable[..., EventPublisher], config: PublisherConfig
) -> Callable[..., EventPublisher]:
    """A registry constructor building `inner` and a bridge child subscribed to it.

    Raises `ConfigError` at engine start, before vLLM's publisher exists, when vLLM would
    connect (not bind) its PUB socket or an endpoint is inproc://: no other process could
    subscribe.
    """

    def construct(data_parallel_rank: int = 0, **kwargs: Any) -> EventPublisher:
        configured = kwargs.get("endpoint", "tcp://*:5557")
        check_bindable(configured)
        if kwargs.get("replay_endpoint"):
            local_url(kwargs["replay_endpoint"])  # inproc:// fails before vLLM binds anything
        zmq_publisher = inner(data_parallel_rank=data_parallel_rank, **kwargs)
        resolved = zmq_publisher.get_publisher_config()
        if resolved is not None:  # what vLLM bound: DP offset applied, tcp://*:0 resolved
            endpoint, replay = resolved.endpoint, resolved.replay_endpoint
        else:
            endpoint = dp_endpoint(configured, data_parallel_rank)
            replay = kwargs.get("replay_endpoint")
            replay = dp_endpoint(replay, data_parallel_rank) if replay else None
        if not replay:
            log.warning(
                "kvscope sidecar: no replay_endpoint in --kv-events-config; ZMQ drops become "
                "Gaps with no recovery"
            )
        source = vllm_source(config, dp_rank=data_parallel_rank, model=_served_model_name())
        command = functools.partial(
            bridge_command, config, source, local_url(endpoint), replay and local_url(replay)
        )
        supervisor = BridgeSupervisor(command, name=f"kvscope-sidecar-dp{data_parallel_rank}")
        log.info(
            "kvscope sidecar: a bridge child forwards %s (replay %s) to Kafka at %s",
            endpoint,
            replay,
            config.bootstrap_servers,
        )
        return KvscopeSidecarPublisher(zmq_publisher, supervisor.start())

    return construct

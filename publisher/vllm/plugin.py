"""The `vllm.general_plugins` entry point: tee vLLM's ZMQ KV events into Kafka.

vLLM loads general plugins in every process it starts. `register()` does nothing unless
`KVSCOPE_BOOTSTRAP_SERVERS` is set; then it wraps the `zmq` constructor in vLLM's
`EventPublisherFactory` registry (the one interface vLLM offers: `KVEventsConfig.publisher`
accepts only `null` and `zmq`), so ZMQ subscribers keep working and every batch is also
published by kvscope. KV events themselves must be switched on with vLLM's own
`--kv-events-config` (vLLM has no plugin interface to switch them on).
"""

from __future__ import annotations

import logging
from typing import Any

from kvscope.publisher.config import PublisherConfig

log = logging.getLogger(__name__)

_WRAPPED_MARK = "__kvscope_tee__"


def register() -> None:
    """Entry point: wrap vLLM's `zmq` publisher when kvscope is configured. Idempotent.

    A bad `KVSCOPE_*` value raises `ConfigError` here, at engine start.
    """
    config = PublisherConfig.from_env().validate()
    if not config.enabled:
        return
    from kvscope.publisher.vllm.kv_events import tee_constructor
    from vllm.distributed.kv_events import EventPublisherFactory

    registry: dict[str, Any] = EventPublisherFactory._registry
    inner = registry["zmq"]
    if getattr(inner, _WRAPPED_MARK, False):
        return
    wrapped = tee_constructor(inner, config)
    setattr(wrapped, _WRAPPED_MARK, True)
    registry["zmq"] = wrapped
    log.info(
        "kvscope: vLLM KV events (publisher zmq) are also sent to Kafka at %s",
        config.bootstrap_servers,
    )

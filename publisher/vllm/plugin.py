"""The `vllm.general_plugins` entry point: tee vLLM's ZMQ KV events into Kafka.

vLLM loads general plugins in every process it starts. `register()` does nothing unless
`KVSCOPE_BOOTSTRAP_SERVERS` is set; then it wraps the `zmq` constructor in vLLM's
`EventPublisherFactory` registry (the one interface vLLM offers: `KVEventsConfig.publisher`
accepts only `null` and `zmq`), so ZMQ subscribers keep working and every batch is also
published by kvscope. KV events themselves must be switched on with vLLM's own
`--kv-events-config` (vLLM has no plugin interface to switch them on).

With `KVSCOPE_KV_EVENTS_SIDECAR=1` the `zmq` constructor is wrapped differently: vLLM's
publisher stays as it is and a supervised `kvscope bridge` child forwards its events to
Kafka (`kvscope.publisher.vllm.sidecar`), so no Kafka work runs in the engine process.

Unless `KVSCOPE_ACCESS_STREAM=0` (or sidecar mode), it also gives every scheduler vLLM
builds an observer of its prefix lookups and releases, which publishes one `BlockAccess`
per request (`kvscope.publisher.vllm.accesses`; supported vLLM versions only).
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
    if config.access_stream and not config.kv_events_sidecar:
        from kvscope.publisher.vllm.accesses import install

        install(config)
    from kvscope.publisher.vllm.kv_events import sidecar_constructor, tee_constructor
    from vllm.distributed.kv_events import EventPublisherFactory

    registry: dict[str, Any] = EventPublisherFactory._registry
    inner = registry["zmq"]
    if getattr(inner, _WRAPPED_MARK, False):
        return
    wrap = sidecar_constructor if config.kv_events_sidecar else tee_constructor
    wrapped = wrap(inner, config)
    setattr(wrapped, _WRAPPED_MARK, True)
    registry["zmq"] = wrapped
    log.info(
        "kvscope: vLLM KV events (publisher zmq) are also sent to Kafka at %s (%s)",
        config.bootstrap_servers,
        "by a bridge child process" if config.kv_events_sidecar else "from the engine process",
    )

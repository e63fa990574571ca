"""The `vllm.general_plugins` entry point: kvscope's switch and its tee of vLLM's KV events.

vLLM loads general plugins in every process it starts, before it parses the command line.
`register()` always does two cheap things so that vLLM's own flag can be the whole switch:
it lets `KVEventsConfig.publisher` accept "kvscope" and registers the `kvscope`
constructor in vLLM's `EventPublisherFactory`, so `--kv-events-config '{"enable_kv_cache_events":
true, "publisher": "kvscope", "endpoint": "kafka://HOST:PORT"}'` turns on the KV events,
the stat logger and the access stream (`kvscope.publisher.vllm.switch`); and it gives
every scheduler an observer that publishes one `BlockAccess` per request when kvscope is
on for that engine (`kvscope.publisher.vllm.accesses`; supported vLLM versions only).

The older form stays: with `KVSCOPE_BOOTSTRAP_SERVERS` set, the `zmq` constructor in the
registry is wrapped so that ZMQ subscribers keep working and every batch is also
published by kvscope. With `KVSCOPE_KV_EVENTS_SIDECAR=1` the `zmq` constructor is wrapped
differently: vLLM's publisher stays as it is and a supervised `kvscope bridge` child
forwards its events to Kafka (`kvscope.publisher.vllm.sidecar`), so no Kafka work runs in
the engine process (and there is no access stream).
"""

from __future__ import annotations

import logging
from typing import Any

from kvscope.publisher.config import PublisherConfig

log = logging.getLogger(__name__)

_WRAPPED_MARK = "__kvscope_tee__"


def register() -> None:
    """Entry point: accept `publisher: kvscope`; wrap vLLM's `zmq` publisher when `KVSCOPE_*`
    configures kvscope. Idempotent.

    A bad `KVSCOPE_*` value raises `ConfigError` here, at engine start.
    """
    from kvscope.publisher.vllm.accesses import install, warn_if_off
    from kvscope.publisher.vllm.kv_events import (
        kvscope_constructor,
        sidecar_constructor,
        tee_constructor,
    )
    from kvscope.publisher.vllm.switch import PUBLISHER_NAME, allow_kvscope_publisher
    from vllm.distributed.kv_events import EventPublisherFactory

    config = PublisherConfig.from_env().validate()
    registry: dict[str, Any] = EventPublisherFactory._registry
    if PUBLISHER_NAME not in registry:
        allow_kvscope_publisher()
        EventPublisherFactory.register_publisher(PUBLISHER_NAME, kvscope_constructor)
    warn_if_off(config, install())
    if not config.enabled:
        return
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

"""The one switch: `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "kvscope",
"endpoint": "kafka://HOST:PORT[,HOST:PORT][?field=value&...]"}'` turns kvscope on in vLLM.

vLLM 0.32's `KVEventsConfig.publisher` is `Literal["null", "zmq"]`, so vLLM refuses the name
before any publisher registry is asked ("Input should be 'null' or 'zmq'"). The general
plugin runs in every vLLM process before the command line is parsed (vLLM's
`AsyncEngineArgs.add_cli_args` loads general plugins first so that they can extend
choices), so `allow_kvscope_publisher()` adds "kvscope" to that literal and registers the
constructor with `EventPublisherFactory.register_publisher`.

The endpoint carries the publisher's settings: the brokers, then any `PublisherConfig` field
as a query parameter (`?linger_ms=500&role=prefill`), plus `zmq=ENDPOINT` to keep vLLM's
own ZMQ publisher running beside kvscope (subscribers, routers). `KVSCOPE_*` environment
variables override the endpoint's values. Passwords are refused in the endpoint (vLLM logs
its config): they come from `KVSCOPE_SASL_PASSWORD` / `KVSCOPE_SSL_PASSWORD` only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Final, Literal, cast
from urllib.parse import parse_qsl, urlsplit

from kvscope.common.env import ENV_PREFIX
from kvscope.common.kafka import SECURITY_FIELDS
from kvscope.publisher.config import PublisherConfig
from kvscope.schemas import ConfigError

PUBLISHER_NAME: Final = "kvscope"
"""The `publisher` value of `--kv-events-config` that selects kvscope."""
SCHEME: Final = "kafka://"
ZMQ_PARAMETER: Final = "zmq"
"""Endpoint query parameter: where vLLM's ZMQ publisher binds beside kvscope's."""
_SECRETS: Final = frozenset({"sasl_password", "ssl_password"})
_FIELDS: Final = frozenset(
    [f.name for f in dataclasses.fields(PublisherConfig) if f.name != "security"]
    + list(SECURITY_FIELDS)
)


@dataclasses.dataclass(frozen=True)
class Switch:
    """What one `publisher: kvscope` endpoint asks for."""

    config: PublisherConfig
    """kvscope's settings: the endpoint's, overridden by `KVSCOPE_*` variables."""
    zmq_endpoint: str | None
    """Where vLLM's own ZMQ publisher binds beside kvscope, None for no ZMQ."""


def parse_endpoint(endpoint: str, environ: Mapping[str, str] | None = None) -> Switch:
    """The `Switch` of a `kafka://...` endpoint; `ConfigError` saying what to fix."""
    if not endpoint.startswith(SCHEME):
        raise ConfigError(
            f'--kv-events-config with "publisher": "{PUBLISHER_NAME}" needs "endpoint": '
            f'"{SCHEME}HOST:PORT[?field=value]", got {endpoint!r}'
        )
    parts = urlsplit(endpoint)
    from_endpoint = {f"{ENV_PREFIX}BOOTSTRAP_SERVERS": parts.netloc}
    zmq_endpoint = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key == ZMQ_PARAMETER:
            zmq_endpoint = value
        elif key in _SECRETS:
            raise ConfigError(f"{key} in the kv-events endpoint: set {ENV_PREFIX}{key.upper()}")
        elif key not in _FIELDS:
            known = ", ".join([*sorted(_FIELDS - _SECRETS), ZMQ_PARAMETER])
            raise ConfigError(f"unknown kvscope setting {key!r} in the endpoint; known: {known}")
        else:
            from_endpoint[ENV_PREFIX + key.upper()] = value
    env = os.environ if environ is None else environ
    set_in_env = {name: value for name, value in env.items() if value != ""}
    config = PublisherConfig.from_env({**from_endpoint, **set_in_env}).validate()
    if not config.enabled:
        raise ConfigError(f"no brokers in the kv-events endpoint {endpoint!r}")
    return Switch(config, zmq_endpoint)


def is_switched_on(kv_events_config: Any) -> bool:
    """Whether vLLM's KV-events config selects kvscope (`publisher: kvscope`, events on)."""
    return bool(
        kv_events_config is not None
        and kv_events_config.enable_kv_cache_events
        and kv_events_config.publisher == PUBLISHER_NAME
    )


def engine_config(vllm_config: Any, environ: Mapping[str, str] | None = None) -> PublisherConfig:
    """kvscope's settings for one vLLM engine: the one switch when it is on, else `KVSCOPE_*`.

    Read by the stat logger (front-end process) and the access stream (engine core), so
    both follow the same switch as the KV events.
    """
    events = getattr(vllm_config, "kv_events_config", None)
    if events is not None and is_switched_on(events):
        return parse_endpoint(events.endpoint, environ).config
    return PublisherConfig.from_env(environ).validate()


def allow_kvscope_publisher() -> None:
    """Let vLLM's `KVEventsConfig` accept `publisher: kvscope`. Idempotent.

    Rebuilds the pydantic dataclass with the literal widened; every other value is checked
    as before (an unknown name still fails with vLLM's own message, now listing kvscope).
    """
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config.kv_events import KVEventsConfig

    field = KVEventsConfig.__dataclass_fields__["publisher"]
    if PUBLISHER_NAME in getattr(field.type, "__args__", ()):
        return
    widened = Literal["null", "zmq", "kvscope"]
    KVEventsConfig.__annotations__["publisher"] = widened
    field.type = widened
    rebuild_dataclass(cast(Any, KVEventsConfig), force=True)

"""`PublisherConfig`: every setting of the engine-side publisher, from arguments or `KVSCOPE_*`.

Environment variables are read here and nowhere else. `validate()` raises `ConfigError`
before anything touches Kafka. Credentials are never part of `repr()` and never logged.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from kvscope.common.env import ENV_PREFIX, read_env
from kvscope.common.kafka import SECURITY_FIELDS, KafkaSecurity, bootstrap_problem
from kvscope.schemas import DEFAULT_TOPIC_PREFIX, ConfigError, Role
from kvscope.schemas.streams import topic_prefix_problem

Compression = Literal["lz4", "zstd", "gzip", "none"]
Acks = Literal["all", "1", "0"]


@dataclass(kw_only=True)
class PublisherConfig:
    """Settings of kvscope's Kafka publisher (and of the vLLM plugin that uses it).

    Each field maps to the environment variable `KVSCOPE_<FIELD NAME IN UPPER CASE>`
    (see `from_env`); docs/publisher.md lists them all.
    """

    bootstrap_servers: str = ""
    """Kafka brokers, `host:port[,host:port...]`. Empty means kvscope is off."""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    """Prefix of the four topics (`{prefix}kv-events`, ...)."""
    client_id: str = "kvscope-publisher"
    """Kafka client id (shows in broker logs and quotas)."""
    queue_size: int = 10_000
    """Records held in memory while waiting for the sender; beyond it publish() drops.

    Bounds memory during a Kafka outage: a queued vLLM batch keeps its token ids until it
    is converted (a few KB each), so 10,000 is tens of MB at most.
    """
    linger_ms: float = 200.0
    """How long the sender lets a batch gather before sending it (once per linger while
    records come; an idle engine never wakes it). Each wake costs the engine about a
    millisecond of CPU and GIL time whatever it sends, so the default trades 200 ms of
    latency for 4x fewer wakes than 50 ms (docs/benchmarks/history.md: the engine lost 6-8% of its
    tokens/s at 50 ms on one core, nothing measurable at 200 ms)."""
    compression: Compression = "lz4"
    """Record batch compression: lz4, zstd, gzip or none."""
    acks: Acks = "all"
    """Broker acknowledgements per batch: all, 1 or 0."""
    max_request_size: int = 1_048_576
    """Largest produce request in bytes; a record larger than this is dropped."""
    max_batch_bytes: int = 262_144
    """Largest record batch per partition in bytes."""
    delivery_timeout_s: float = 30.0
    """A record not acknowledged within this time is dropped and reported as a Gap."""
    reconnect_backoff_max_s: float = 5.0
    """Longest wait between attempts to reach the brokers while none answers."""
    relay: str = ""
    """A per-host `kvscope relay` to hand encoded records to, `ipc:///PATH` or
    `tcp://HOST:PORT`; the relay owns the Kafka client, so none runs in this process
    (docs/publisher.md, "Relay"). Empty: this process sends to Kafka itself."""
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """Kafka client security, the block the collector and the bridge share. Its fields are
    read from `KVSCOPE_<FIELD>` like the others (`KVSCOPE_SECURITY_PROTOCOL`,
    `KVSCOPE_SASL_USERNAME`, `KVSCOPE_SASL_PASSWORD`, ...)."""
    instance: str = ""
    """Instance name in every record's source; the vLLM plugin defaults it to host:port."""
    role: Role = "both"
    """prefill, decode or both (not disaggregated)."""
    model: str = ""
    """Model name in the source; the vLLM plugin defaults it to the served model name."""
    stats_interval_s: float = 10.0
    """Seconds between two EngineStats snapshots from the vLLM stat logger."""
    forward_token_ids: bool = False
    """Forward the token ids of stored blocks (they dominate payload size; counts are kept)."""
    access_stream: bool = True
    """vLLM plugin: publish one `BlockAccess` per request (stream kv-accesses) from the
    scheduler's own prefix lookup, for the exact capacity what-if and `kvscope trace export`
    (docs/publisher.md, "Access stream"). Off in sidecar mode (no Kafka in the engine)."""
    kv_events_sidecar: bool = False
    """vLLM plugin: leave vLLM's ZMQ publisher alone and forward its KV events to Kafka from
    a supervised `kvscope bridge` child process instead of teeing them inside the engine
    (docs/publisher.md, "Sidecar mode"). Needs a bound endpoint (tcp://*:PORT or ipc://)."""

    def security_kwargs(self) -> dict[str, Any]:
        """aiokafka client arguments for security_protocol, SASL and SSL.

        Producers and consumers take the same ones: the publisher, the bridge and the
        collector all read them from these fields (`KVSCOPE_SECURITY_PROTOCOL`, ...).
        """
        return self.security.client_kwargs()

    @property
    def enabled(self) -> bool:
        """kvscope publishes only when brokers are configured."""
        return bool(self.bootstrap_servers.strip())

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> PublisherConfig:
        """Build a config from `KVSCOPE_*` variables; explicit `overrides` win.

        Overrides may name the security block's fields directly (`sasl_username=...`, as
        the command-line flags give them) or pass a whole `security` block. Raises
        `ConfigError` naming the variable when a value has the wrong type.
        """
        env = os.environ if environ is None else environ
        flags = {name: overrides.pop(name) for name in SECURITY_FIELDS if name in overrides}
        values = read_env(cls, env)
        values["security"] = KafkaSecurity.from_env(env, **flags)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def env_variables(cls) -> tuple[str, ...]:
        """Every environment variable `from_env` reads (the security block's included)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "security"]
        return tuple(ENV_PREFIX + name.upper() for name in (*names, *SECURITY_FIELDS))

    def validate(self) -> PublisherConfig:
        """Check every field; raise `ConfigError` with the fix. Returns self for chaining."""
        if self.enabled and (problem := bootstrap_problem(self.bootstrap_servers)):
            raise ConfigError(f"{problem} (KVSCOPE_BOOTSTRAP_SERVERS=host:port[,host:port])")
        if self.relay and (problem := relay_address_problem(self.relay)):
            raise ConfigError(f"relay {self.relay!r}: {problem} (KVSCOPE_RELAY)")
        problem = topic_prefix_problem(self.topic_prefix)
        if problem:
            raise ConfigError(problem)
        _positive("queue_size", self.queue_size)
        _positive("max_request_size", self.max_request_size)
        _positive("max_batch_bytes", self.max_batch_bytes)
        _positive("delivery_timeout_s", self.delivery_timeout_s)
        _positive("reconnect_backoff_max_s", self.reconnect_backoff_max_s)
        _positive("stats_interval_s", self.stats_interval_s)
        if not 0 <= self.linger_ms <= MAX_LINGER_MS:
            raise ConfigError(f"linger_ms must be 0..{MAX_LINGER_MS}, got {self.linger_ms}")
        for name in ("compression", "acks", "role"):
            allowed = get_args(_LITERALS[name])
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} {getattr(self, name)!r}: choose one of {', '.join(allowed)}"
                )
        self.security.validate()
        return self


_LITERALS: dict[str, Any] = {
    "compression": Compression,
    "acks": Acks,
    "role": Role,
}


MAX_LINGER_MS: Final = 60_000.0
"""Longest sender drain interval accepted (a minute)."""


def _positive(name: str, value: float) -> None:
    """`value` must be a finite number > 0 (NaN and infinities fail every comparison)."""
    if not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")


def relay_address_problem(address: str) -> str | None:
    """What is wrong with a relay address (None if nothing): `ipc:///PATH` or `tcp://HOST:PORT`."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in ("ipc", "tcp"):
        return "use ipc:///PATH or tcp://HOST:PORT"
    if scheme == "ipc":
        return (
            None
            if rest.strip()
            else "ipc:// needs a socket path, e.g. ipc:///run/kvscope/relay.sock"
        )
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "tcp:// needs HOST:PORT with a port 1..65535"
    return None

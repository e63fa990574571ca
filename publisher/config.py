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

from kvscope.schemas import DEFAULT_TOPIC_PREFIX, ConfigError, Role
from kvscope.schemas.streams import topic_prefix_problem

Compression = Literal["lz4", "zstd", "gzip", "none"]
Acks = Literal["all", "1", "0"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

ENV_PREFIX: Final = "KVSCOPE_"


@dataclass(frozen=True, kw_only=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts: one block for every kvscope client.

    `PublisherConfig` embeds it as `security` (read from `KVSCOPE_<FIELD>`); the publisher,
    the collector and the bridge build their clients from it (collect and bridge also take
    `--security-protocol`, `--sasl-*`, `--ssl-*` flags over the variables; passwords only
    from `KVSCOPE_SASL_PASSWORD` / `KVSCOPE_SSL_PASSWORD`). Passwords never appear in
    `repr()` and are never logged.
    """

    security_protocol: SecurityProtocol = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: SaslMechanism = "PLAIN"
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with a SASL_* protocol)."""
    sasl_username: str = ""
    """SASL user name."""
    sasl_password: str = field(default="", repr=False)
    """SASL password (never logged)."""
    ssl_cafile: str = ""
    """CA bundle that signs the brokers' certificates (SSL, SASL_SSL; default: the system's)."""
    ssl_certfile: str = ""
    """Client certificate for mutual TLS."""
    ssl_keyfile: str = ""
    """Private key of the client certificate."""
    ssl_password: str = field(default="", repr=False)
    """Password of the private key (never logged)."""

    def validate(self) -> KafkaSecurity:
        """Raise `ConfigError` naming the setting and the fix; returns self."""
        for name in ("security_protocol", "sasl_mechanism"):
            allowed = get_args(_LITERALS[name])
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} {getattr(self, name)!r}: choose one of {', '.join(allowed)}"
                )
        sasl = self.security_protocol.startswith("SASL")
        ssl = self.security_protocol.endswith("SSL")
        if sasl and not self.sasl_username:
            raise ConfigError(f"security_protocol {self.security_protocol} needs sasl_username")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("ssl_keyfile needs ssl_certfile")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path and not ssl:
                raise ConfigError(
                    f"{name} is set but security_protocol is {self.security_protocol}: "
                    "use SSL or SASL_SSL"
                )
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ConfigError(f"{name} {path!r} is not a readable file")
        return self

    def client_kwargs(self) -> dict[str, Any]:
        """aiokafka producer/consumer arguments of this block (validate() first)."""
        kwargs: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        if self.security_protocol.endswith("SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile or None,
                certfile=self.ssl_certfile or None,
                keyfile=self.ssl_keyfile or None,
                password=self.ssl_password or None,
            )
        return kwargs


SECURITY_FIELDS: Final = tuple(f.name for f in dataclasses.fields(KafkaSecurity))
"""The fields of the shared block (`KVSCOPE_<FIELD>`, and the `from_env` overrides)."""


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
    latency for 4x fewer wakes than 50 ms (docs/benchmarks.md: the engine lost 6-8% of its
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
        values = _read_env(cls, env)
        security = _read_env(KafkaSecurity, env)
        for name in SECURITY_FIELDS:
            if name in overrides:
                security[name] = overrides.pop(name)
        values["security"] = KafkaSecurity(**security)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def env_variables(cls) -> tuple[str, ...]:
        """Every environment variable `from_env` reads (the security block's included)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "security"]
        return tuple(ENV_PREFIX + name.upper() for name in (*names, *SECURITY_FIELDS))

    def validate(self) -> PublisherConfig:
        """Check every field; raise `ConfigError` with the fix. Returns self for chaining."""
        if self.enabled:
            for server in self.bootstrap_servers.split(","):
                if host_and_port(server) is None:
                    raise ConfigError(
                        f"bootstrap_servers: {server.strip()!r} is not host:port "
                        "(KVSCOPE_BOOTSTRAP_SERVERS=host:port[,host:port])"
                    )
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
    "security_protocol": SecurityProtocol,
    "sasl_mechanism": SaslMechanism,
}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


MAX_LINGER_MS: Final = 60_000.0
"""Longest sender drain interval accepted (a minute)."""


def host_and_port(server: str) -> tuple[str, int] | None:
    """One bootstrap server's host and port (1..65535), or None when it is not host:port
    (an IPv6 host keeps its brackets)."""
    host, _, port = server.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def unbracketed(host: str) -> str:
    """A listen host as sockets take it: an IPv6 literal without the brackets URLs put
    around it ("[::1]" -> "::1"); any other host unchanged."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def _positive(name: str, value: float) -> None:
    """`value` must be a finite number > 0 (NaN and infinities fail every comparison)."""
    if not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")


def _read_env(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """The fields of dataclass `cls` set in `env` as `KVSCOPE_<FIELD>` (nested blocks skipped)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = ENV_PREFIX + f.name.upper()
        raw = env.get(name)
        if raw is None or raw == "" or dataclasses.is_dataclass(f.default_factory):
            continue
        values[f.name] = _parse(name, raw, f.type)
    return values


def _parse(name: str, raw: str, annotation: Any) -> Any:
    """Convert one environment value to the field's type (annotations are strings here)."""
    kind = str(annotation)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r}: use true or false")
    return raw.strip()

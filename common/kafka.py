"""Kafka client settings shared by every kvscope client: the publisher, the bridge, the
collector, the consumer and the index/router services.

`KafkaSecurity` is how a client authenticates and encrypts; `KafkaSettings` is what a
service-side client needs (brokers + security); `host_and_port`/`bootstrap_problem` are the
one parser of bootstrap servers; `unbracketed` turns URL-style IPv6 hosts into socket hosts;
`start_or_close` starts an aiokafka client without leaking it when no broker answers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, get_args

from kvscope.common.env import read_env
from kvscope.schemas.errors import ConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
_LITERALS: Final[dict[str, Any]] = {
    "security_protocol": SecurityProtocol,
    "sasl_mechanism": SaslMechanism,
}


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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> KafkaSecurity:
        """The block from `KVSCOPE_<FIELD>` variables; explicit `overrides` (the command
        line's flags) win. Raises `ConfigError` naming a variable of the wrong type."""
        values = read_env(cls, os.environ if environ is None else environ)
        values.update(overrides)
        return cls(**values)


SECURITY_FIELDS: Final = tuple(f.name for f in dataclasses.fields(KafkaSecurity))
"""The fields of the shared block (`KVSCOPE_<FIELD>`, and the `from_env` overrides)."""


@dataclass(frozen=True, kw_only=True)
class KafkaSettings:
    """What a service-side Kafka client needs: the brokers and the security block."""

    bootstrap_servers: str
    """Kafka brokers, `host:port[,host:port...]`."""
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    """Authentication and encryption (read from `KVSCOPE_<FIELD>` by `from_env`)."""

    @classmethod
    def from_env(
        cls, bootstrap_servers: str, environ: Mapping[str, str] | None = None, **security: Any
    ) -> KafkaSettings:
        """Settings for `bootstrap_servers`, security from `KVSCOPE_*` with `security`
        overrides (flags) winning."""
        return cls(
            bootstrap_servers=bootstrap_servers,
            security=KafkaSecurity.from_env(environ, **security),
        )

    def security_kwargs(self) -> dict[str, Any]:
        """aiokafka producer/consumer arguments for security_protocol, SASL and SSL."""
        return self.security.client_kwargs()

    def validate(self) -> KafkaSettings:
        """Raise `ConfigError` on servers that are not host:port or a bad security block."""
        problem = bootstrap_problem(self.bootstrap_servers)
        if problem:
            raise ConfigError(problem)
        self.security.validate()
        return self


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


def bootstrap_problem(servers: str) -> str | None:
    """Why the comma-separated `servers` are not all host:port (port 1..65535), or None."""
    for server in servers.split(","):
        if host_and_port(server) is None:
            return f"bootstrap_servers: {server.strip()!r} is not host:port"
    return None


class _Startable(Protocol):
    """An aiokafka consumer or producer: started, and stopped even when the start failed."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def start_or_close(client: _Startable) -> None:
    """Start `client`; when that fails (no broker answers, bad credentials, cancelled) stop
    it before re-raising, so no connection or background task of a half-started client is
    left behind (the consumer iterator and the index's feed both start consumers this way)."""
    try:
        await client.start()
    except BaseException:
        await client.stop()
        raise

"""`RelayConfig`: the settings of one `kvscope relay` (the one source of its defaults)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvscope.common.net import is_loopback
from kvscope.publisher.config import PublisherConfig, relay_address_problem
from kvscope.schemas import ConfigError


def default_listen() -> str:
    """`ipc://` in `$XDG_RUNTIME_DIR` when set (private to the user), else in /tmp."""
    folder = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"ipc://{folder}/kvscope-relay.sock"


@dataclass(kw_only=True)
class RelayConfig:
    """Settings of one relay process."""

    listen: str = field(default_factory=default_listen)
    """Where engines connect: `ipc:///PATH` or `tcp://HOST:PORT` (loopback unless
    `allow_remote`)."""
    allow_remote: bool = False
    """Accept a tcp:// listen address that is not loopback (engines on other hosts)."""
    max_inflight_records: int = 200_000
    """Records taken and not yet acknowledged by Kafka; a batch beyond it is refused at once
    (acked lost, reason `relay_full`), so memory stays bounded when Kafka is slow."""
    linger_ms: float = 0.0
    """aiokafka's linger. The relay builds each engine batch's record batches itself, as
    the in-process sender does, so none is needed; a positive value only delays them."""
    producer: PublisherConfig = field(default_factory=PublisherConfig)
    """Brokers, client id, compression, acks, `delivery_timeout_s` and security (the
    publisher's own settings, `KVSCOPE_*`)."""

    def validate(self) -> RelayConfig:
        """Check every field; raise `ConfigError` with the fix. Returns self for chaining."""
        if problem := relay_address_problem(self.listen):
            raise ConfigError(f"--listen {self.listen!r}: {problem}")
        if self.listen.startswith("tcp://") and not self.allow_remote:
            host = self.listen[len("tcp://") :].rpartition(":")[0]
            if host == "*" or not is_loopback(host.strip("[]")):
                raise ConfigError(
                    f"--listen {self.listen!r} is not a loopback address: use 127.0.0.1, "
                    "or --allow-remote to accept engines from other hosts"
                )
        if self.max_inflight_records <= 0:
            raise ConfigError(
                f"--max-inflight-records must be > 0, got {self.max_inflight_records}"
            )
        if not 0 <= self.linger_ms <= 1000:
            raise ConfigError(f"--linger-ms must be 0..1000, got {self.linger_ms}")
        if not self.producer.enabled:
            raise ConfigError("give --bootstrap-servers host:port[,host:port]")
        self.producer.validate()
        return self

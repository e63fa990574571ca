"""`CollectorConfig`: everything a user sets for `kvscope collect`, validated up front."""

from __future__ import annotations

import dataclasses
import math

from kvscope.collector.storage.cluster import check_cluster_name
from kvscope.collector.storage.tables import STREAM_TABLES
from kvscope.collector.storage.target import Target, parse_target
from kvscope.common.kafka import KafkaSettings
from kvscope.schemas import DEFAULT_TOPIC_PREFIX, topic_for
from kvscope.schemas.errors import ConfigError
from kvscope.schemas.streams import topic_prefix_problem

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class CollectorConfig:
    """User settings of one collector (one Kafka consumer in a consumer group)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Kafka bootstrap servers, comma-separated host:port."""
    target: Target = dataclasses.field(default_factory=parse_target)
    """Where the tables live (see `kvscope.collector.storage.target`)."""
    group: str = "kvscope-collector"
    """Kafka consumer group: collectors in one group share the partitions."""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    """Topic prefix; stream S is read from topic `{prefix}{S}`."""
    streams: tuple[str, ...] = tuple(STREAM_TABLES)
    """Streams to collect (default: every stream that has a table)."""
    batch_rows: int = 200_000
    """Flush once this many rows are buffered (large inserts are what makes ClickHouse fast)."""
    batch_seconds: float = 1.0
    """Flush at the latest this long after the first buffered record (freshness bound)."""
    max_poll_records: int = 5_000
    """Records taken from the consumer per poll (bounds memory between flushes)."""
    exit_when_idle: float | None = None
    """Stop cleanly once partitions are assigned and no record arrived for this many seconds."""
    metrics_port: int | None = None
    """Serve Prometheus /metrics on this port (None: off)."""
    metrics_host: str = "127.0.0.1"
    """Address of the /metrics listener (loopback unless configured)."""
    session_timeout_ms: int = 10_000
    """Kafka group session timeout."""
    max_partition_fetch_bytes: int = 16 * MIB
    """Largest fetch per partition; must exceed the largest record (the broker's limit)."""
    fetch_max_bytes: int = 64 * MIB
    """Largest fetch response."""
    retry_initial_s: float = 0.2
    """First backoff after a failed insert; doubles up to `retry_max_s`, with jitter."""
    retry_max_s: float = 10.0
    """Longest backoff between insert retries."""
    cluster: str | None = None
    """ClickHouse cluster of `kvscope migrate --cluster`: insert into the shard-local
    replicated tables of the node connected to (with a majority quorum), read resume
    positions through the Distributed tables with sequential consistency."""
    kafka: KafkaSettings | None = None
    """Kafka client settings: the brokers and their security (security_protocol, sasl_*,
    ssl_*), the same block and `KVSCOPE_*` variables as the publisher's (docs/publisher.md);
    `kvscope collect` reads them from the environment. None is PLAINTEXT."""
    residency: bool = True
    """Keep the materialized residency current (one refresher per database: turn it off
    on all but one collector process of a server; never in cluster mode, which does not
    support the derived tables yet). Queries over it refresh it themselves, so off only
    moves the work to the first query."""
    residency_interval_s: float = 10.0
    """While block events keep arriving, refresh the residency at most this often; it is
    also refreshed as soon as the collector goes quiet and when it stops. A refresh has a
    fixed cost of about half a CPU-second (docs/benchmarks.md), so 0 (after every batch)
    costs the ingest rate; larger values make the first query after a burst do more."""
    shutdown_timeout_s: float = 30.0
    """On stop, keep retrying the final flush this long before giving up (nothing is lost:
    unstored records are simply not committed)."""

    def topics(self) -> dict[str, str]:
        """Topic name -> stream name of every collected stream."""
        return {topic_for(stream, self.topic_prefix): stream for stream in self.streams}

    @property
    def security_protocol(self) -> str:
        """The Kafka security protocol of `kafka` (PLAINTEXT without it)."""
        return "PLAINTEXT" if self.kafka is None else self.kafka.security.security_protocol

    def validate(self) -> CollectorConfig:
        """Raise `ConfigError` on settings that cannot work; return self."""
        unknown = set(self.streams) - set(STREAM_TABLES)
        if unknown or not self.streams:
            raise ConfigError(
                f"streams must be among {', '.join(STREAM_TABLES)}, got {self.streams}"
            )
        if not self.bootstrap_servers.strip():
            raise ConfigError("--bootstrap-servers is empty")
        if not self.group.strip():
            raise ConfigError("--group is empty")
        problem = topic_prefix_problem(self.topic_prefix)
        if problem:
            raise ConfigError(f"--topic-prefix: {problem}")
        if self.batch_rows < 1 or self.max_poll_records < 1:
            raise ConfigError("batch rows and poll records must be >= 1")
        if self.batch_rows > 1_000_000:
            raise ConfigError("--batch-rows must be <= 1000000 (one insert must stay one block)")
        if not 0 < self.batch_seconds < math.inf:  # nan too: it never flushed by time
            raise ConfigError("--batch-seconds must be a number of seconds > 0")
        if not 0 <= self.residency_interval_s <= 86_400:
            raise ConfigError("--residency-interval must be 0..86400 seconds")
        if self.exit_when_idle is not None and not 0 < self.exit_when_idle < math.inf:
            raise ConfigError("--exit-when-idle must be a number of seconds > 0")
        if not 1_000 <= self.session_timeout_ms <= 3_600_000:
            raise ConfigError(
                f"--session-timeout-ms must be 1000..3600000, got {self.session_timeout_ms} "
                "(the broker also bounds it: 6 s to 30 min by default)"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port must be 0..65535, got {self.metrics_port}")
        if self.max_partition_fetch_bytes > self.fetch_max_bytes:
            raise ConfigError("max_partition_fetch_bytes must be <= fetch_max_bytes")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ConfigError("need 0 < retry_initial_s <= retry_max_s")
        if self.cluster is not None:
            check_cluster_name(self.cluster)
        if self.kafka is not None:
            self.kafka.validate()
        return self

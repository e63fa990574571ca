"""The collector's Prometheus metrics (default registry) and its HTTP listener.

The listener serves /metrics and /healthz: 200 while the consume loop keeps polling
Kafka (it polls at least every 0.2 s, also while paused), 503 once it has not polled for
`Liveness.max_age_s` (a hung insert or a wedged event loop), so a Kubernetes liveness
probe restarts it; the group then hands its partitions to another member.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from kvscope.collector.storage.tables import (
    INGEST_BATCHES,
    INGEST_ERRORS,
    INGEST_INSERTS,
    STREAM_GAPS,
)
from kvscope.common.kafka import unbracketed
from kvscope.common.metrics import counter, gauge, histogram
from kvscope.schemas.errors import ConfigError
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

RECORDS_CONSUMED = counter(
    "kvscope_collector_records_consumed_total",
    "Kafka records consumed (decoded or not), per topic",
    ["topic"],
)
ROWS_INSERTED = counter(
    "kvscope_collector_rows_inserted_total", "Rows inserted into ClickHouse, per table", ["table"]
)
INSERT_SECONDS = histogram(
    "kvscope_collector_insert_seconds",
    "Duration of successful ClickHouse inserts, per table",
    ["table"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ERRORS = counter(
    "kvscope_collector_errors_total",
    f"Errors by kind: decode (record to {INGEST_ERRORS.name}), sink (failed insert/query), "
    "commit (offset commit or committed-offset read), offset_reset (the broker lost the log)",
    ["kind"],
)
GAPS = counter(
    "kvscope_collector_gaps_total",
    f"Sequence gaps written to {STREAM_GAPS.name}, by who detected them",
    ["detected_by"],
)
PAUSED_PARTITIONS = gauge(
    "kvscope_collector_paused_partitions", "Partitions paused because the sink is failing"
)
LAG = gauge(
    "kvscope_collector_lag_records",
    "Records between the partition's high watermark (as the broker reports it) and the "
    "collector's position",
    ["topic", "partition"],
)
BUFFERED_ROWS = gauge("kvscope_collector_buffered_rows", "Rows decoded and waiting for insert")
COMMITS = counter(
    "kvscope_collector_commits_total",
    "Successful Kafka offset commits (after the rows they cover were stored)",
)
BATCH_ROWS = histogram(
    "kvscope_collector_batch_rows",
    "Rows per flushed batch",
    buckets=(10, 100, 1_000, 10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000),
)


class Liveness:
    """When the consume loop last polled; fresh for `max_age_s` (also right after start)."""

    def __init__(
        self, max_age_s: float = 120.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._last = clock()

    def beat(self) -> None:
        """The loop is alive (called on every poll)."""
        self._last = self._clock()

    def fresh(self) -> bool:
        """True unless the loop has not polled for longer than `max_age_s`."""
        return self._clock() - self._last <= self.max_age_s


LIVENESS = Liveness()
_Respond = Callable[[str, list[tuple[str, str]]], Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not logged (one line every few seconds otherwise)."""


def app(liveness: Liveness = LIVENESS) -> Callable[[dict, _Respond], Iterable[bytes]]:
    """The WSGI app: /healthz from `liveness`, everything else the registry's metrics."""
    metrics_app = make_wsgi_app()

    def serve_request(environ: dict, respond: _Respond) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            alive = liveness.fresh()
            respond(
                "200 OK" if alive else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8")],
            )
            return [b"ok\n" if alive else b"consume loop stalled\n"]
        return metrics_app(environ, respond)

    return serve_request


def serve(port: int, host: str = "127.0.0.1", liveness: Liveness = LIVENESS) -> None:
    """Serve /metrics and /healthz on host:port (a daemon thread); IPv4 or IPv6 host, an
    IPv6 literal with or without its URL brackets.

    An address that cannot be listened on (in use, unknown host) raises `ConfigError`."""
    address = unbracketed(host)
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Server", (ThreadingWSGIServer,), {"address_family": family})
        server: WSGIServer = make_server(
            address, port, app(liveness), server_class, handler_class=_QuietHandler
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); choose another "
            "--metrics-port or --metrics-host"
        ) from None
    threading.Thread(target=server.serve_forever, name="kvscope-metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics (liveness on /healthz)", host, port)


def counter_total(metric: Any, skip_tables: frozenset[str] = frozenset()) -> int:
    """The sum of a counter's samples over all its labels (what this process counted),
    leaving out samples whose `table` label is in `skip_tables`."""
    return int(
        sum(
            sample.value
            for family in metric.collect()
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels.get("table") not in skip_tables
        )
    )


BOOKKEEPING = frozenset((INGEST_BATCHES.name, INGEST_INSERTS.name))
"""Tables of the collector's own notes (not data): left out of `rows_inserted`."""


def rows_inserted() -> int:
    """Rows this process stored into ClickHouse so far, all data tables together."""
    return counter_total(ROWS_INSERTED, BOOKKEEPING)

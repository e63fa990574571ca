"""The collector's Prometheus metrics (default registry) and the /metrics listener."""

from __future__ import annotations

import logging

from kvscope.collector.storage.tables import INGEST_ERRORS, STREAM_GAPS
from kvscope.publisher.metrics import counter, gauge, histogram
from prometheus_client import start_http_server

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
    f"Errors by kind: decode (record to {INGEST_ERRORS.name}), sink (failed insert/query), commit",
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
BATCH_ROWS = histogram(
    "kvscope_collector_batch_rows",
    "Rows per flushed batch",
    buckets=(10, 100, 1_000, 10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000),
)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve /metrics from the default registry on host:port (a daemon thread)."""
    start_http_server(port, addr=host)
    log.info("metrics on http://%s:%d/metrics", host, port)

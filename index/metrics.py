"""The index's Prometheus metrics (default registry, served on the index's `/metrics`)."""

from __future__ import annotations

from kvscope.common.metrics import counter, gauge, histogram

RECORDS = counter("kvscope_index_records", "kv-events records read from Kafka and applied")
APPLIED_EVENTS = counter(
    "kvscope_index_applied_events", "Block events (one per hash) and clears applied"
)
UNDECODABLE = counter("kvscope_index_undecodable_records", "Records that could not be decoded")
LAG_SECONDS = gauge(
    "kvscope_index_lag_seconds", "Now minus the newest applied record's engine timestamp"
)
STALE_SOURCES = gauge("kvscope_index_stale_sources", "Sources whose state may miss events")
SOURCES = gauge("kvscope_index_sources", "Sources the index holds")
RESIDENT_HASHES = gauge("kvscope_index_resident_hashes", "Distinct resident block hashes")
TABLE_BYTES = gauge("kvscope_index_table_bytes", "Memory of the resident-block table")
SCORE_SECONDS = histogram(
    "kvscope_index_score_seconds",
    "Time to answer one score request inside the index",
    buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1),
)
COLD_START_SECONDS = gauge(
    "kvscope_index_cold_start_seconds", "Time to load the stored state at start"
)
CONNECTED = gauge("kvscope_index_connected", "1 while the feed reads Kafka, 0 during an outage")
CAUGHT_UP = gauge("kvscope_index_caught_up", "1 while the feed has read the topic to its end")
RECONNECTS = counter("kvscope_index_reconnects", "Connections to Kafka made after a lost one")
LOG_RESETS = counter(
    "kvscope_index_log_resets",
    "Partitions found holding a new log (the broker lost its log) and read again from the start",
)
FORGOTTEN_SOURCES = counter(
    "kvscope_index_forgotten_sources", "Sources dropped (DELETE /sources, or idle expiry)"
)
REJECTED_REQUESTS = counter(
    "kvscope_index_rejected_requests", "Score or routed requests over the token or block cap"
)

"""The relay's Prometheus metrics (default registry), served by `kvscope relay --metrics-port`."""

from __future__ import annotations

from kvscope.common.metrics import counter, gauge

RECEIVED = counter("kvscope_relay_received_records", "Records engines handed to the relay")
DELIVERED = counter("kvscope_relay_delivered_records", "Records Kafka acknowledged")
LOST = counter(
    "kvscope_relay_lost_records",
    "Records acked back to their engine as lost, by reason (relay_full, broker_unavailable, "
    "send_failed)",
    ["reason"],
)
MALFORMED = counter(
    "kvscope_relay_malformed_messages", "Messages that were no relay batch (ignored, no ack)"
)
INFLIGHT = gauge("kvscope_relay_inflight_records", "Records taken and not yet acknowledged")

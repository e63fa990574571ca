"""The bridge's Prometheus metrics (default registry), served by `kvscope bridge --prometheus-port`.

Per endpoint: batches forwarded, engine batches reported lost (by reason), messages that
were no engine batch at all, events of unknown types skipped, replay requests (by result)
and the batches replays returned. Next to them the same registry holds the Kafka
publisher's own metrics (published, dropped, queue depth, send latency).
"""

from __future__ import annotations

from kvscope.common.metrics import counter

FORWARDED = counter(
    "kvscope_bridge_forwarded_batches",
    "Engine KV-event batches the bridge forwarded to Kafka",
    ["endpoint"],
)
LOST = counter(
    "kvscope_bridge_lost_batches",
    "Engine KV-event batches the bridge could not recover and reported in a Gap",
    ["endpoint", "reason"],
)
MALFORMED_MESSAGES = counter(
    "kvscope_bridge_malformed_messages",
    "Live ZMQ messages ignored for not being [topic, 8-byte seq, payload] (no engine seq: a "
    "batch one of them hid shows up as a seq gap)",
    ["endpoint"],
)
UNKNOWN_EVENTS = counter(
    "kvscope_bridge_unknown_events",
    "Engine events of a type this kvscope does not know: skipped, the rest of the batch forwarded",
    ["endpoint"],
)
REPLAYS = counter(
    "kvscope_bridge_replays",
    "Replay requests to engines' replay sockets, by result (ok, timeout, error)",
    ["endpoint", "result"],
)
REPLAYED = counter(
    "kvscope_bridge_replayed_batches",
    "Batches engines' replay sockets returned",
    ["endpoint"],
)

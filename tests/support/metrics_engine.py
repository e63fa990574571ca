"""A stand-in engine process for the Prometheus scrape test: kvscope's real publisher code.

Run as `python metrics_engine.py BOOTSTRAP PREFIX METRICS_PORT DEAD_PORT`. It serves the
default registry on 127.0.0.1:METRICS_PORT (what vLLM's /metrics shows for the plugin),
then makes the publisher's metrics real: engine stats published through a queue too
small for a burst (queue_full drops, reported as Gaps), KV transfers timed by
`TransferTimer` for two prefill -> decode pairs, and a second publisher pointed at a port
nothing listens on (connect errors, records dropped). Prints `ready`, then waits for
stdin to close.
"""

from __future__ import annotations

import sys

from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.publisher.transfer_timer import TransferTimer
from kvscope.schemas import EngineStats, Source
from prometheus_client import start_http_server


def main() -> None:
    """Publish, time, fail as described in the module doc; stay up until stdin closes."""
    bootstrap, prefix, port, dead_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start_http_server(port, addr="127.0.0.1")
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap, topic_prefix=prefix, queue_size=8)
    )
    engine = kafka.for_source(Source(instance="prefill-0", model="m", role="prefill"))
    for i in range(200):
        engine.publish(EngineStats(capacity_blocks=100, block_size=16, usage=(i % 10) / 10))
    timers = [
        TransferTimer(engine, backend="nixl", src_instance="prefill-0", dst_instance=dst)
        for dst in ("decode-0", "decode-1")
    ]
    for i, timer in enumerate(timers * 4):
        timer.begin(f"req-{i}")
        timer.end(f"req-{i}", bytes=1 << 20, blocks=4, last=True)
    kafka.flush(10)
    unreachable = KafkaPublisher(
        PublisherConfig(
            bootstrap_servers=f"127.0.0.1:{dead_port}",
            topic_prefix=prefix,
            delivery_timeout_s=1.0,
            reconnect_backoff_max_s=0.2,
        )
    )
    unreachable.for_source(Source(instance="decode-9", model="m")).publish(
        EngineStats(capacity_blocks=1, block_size=16, usage=0.0)
    )
    print("ready", flush=True)
    sys.stdin.read()
    unreachable.shutdown(1)
    kafka.shutdown(5)


if __name__ == "__main__":
    main()

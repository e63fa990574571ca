"""simulate → real broker → collector → chDB → queries, compared with the ground truth.

One disaggregated fleet (prefill, decode and both instances, a reset, a slow transfer
pair) is published through the real Kafka publisher to the local broker, collected by
the real collector, and every analytics query is checked against the simulator's truth:
counts, sums, maxima, rates and ratios exactly (equal means equal), quantiles within the
t-digest bound (analytics_kit).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import Fleet, SimConfig, parse_instances
from kvscope.simulator.sinks import KafkaSink
from support.analytics_kit import assert_matches_truth, query
from support.collector_testkit import SESSION_TIMEOUT_MS


def test_pipeline_matches_truth(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    config = SimConfig(
        instances=parse_instances("2p,2d,1b"),
        workload="generated-shared-prefix",
        workload_params={"groups": 12},
        requests=400,
        capacity_blocks=300,
        routing="random",
        seed=11,
        slow_pair="prefill-0->decode-1",
        resets=(("engine-0", 6.0),),
    )
    sink = KafkaSink(bootstrap_servers, topic_prefix)
    fleet = Fleet(config, sink)
    truth = fleet.run()
    assert sink.close(30.0)
    collector = CollectorConfig(
        bootstrap_servers=bootstrap_servers,
        target=parse_target(clickhouse_url),
        group=f"g-{topic_prefix}",
        topic_prefix=topic_prefix,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        batch_seconds=0.3,
        exit_when_idle=2.0,
    )
    migrate(clickhouse, collector.target)
    asyncio.run(Collector(collector, sink=ClickHouseSink(ChdbStore(clickhouse))).run())

    assert truth["sources"]["engine-0/0"]["cleared"] == 1
    assert sum(s["refaults"] for s in truth["sources"].values()) > 0
    assert_matches_truth(clickhouse, truth, fleet.truth.samples())
    pairs = {
        f"{r['src_instance']}->{r['dst_instance']}": r["p50_ms"]
        for r in query(clickhouse, "transfer_latency", bucket_s=86400 * 365)
    }
    slow = pairs.pop("prefill-0->decode-1")
    assert slow > 2 * max(pairs.values())

"""A real vLLM engine (no kvscope plugin) -> ZMQ -> kvscope bridge -> Kafka -> collector -> chDB.

The engine runs in a subprocess (like an unmodified engine pod); a direct ZMQ subscriber
connected before any request records the ground truth. The bridge starts late on
purpose (after the engine's first batches), so its first records come from vLLM's
replay socket. The same engine's Prometheus registry is scraped into engine-histograms.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from bridge_zmq_truth import DirectSubscriber, wait_for
from kvscope.collector.config import CollectorConfig
from kvscope.collector.local_broker import free_port
from kvscope.collector.migrate import migrate
from kvscope.collector.queries import run_query
from kvscope.collector.service import Collector
from kvscope.collector.target import parse_target
from kvscope.collector.write import ClickHouseSink
from kvscope.publisher.bridge import Bridge, BridgeConfig, Endpoint
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.publisher.scrape import MetricsScraper, parse_series
from kvscope.schemas import AllBlocksCleared, Source, decode_engine_payload

pytest.importorskip("vllm")
ENGINE = Path(__file__).with_name("vllm_engine_proc.py")
REQUESTS = 8
"""Requests the engine process runs (3 + 3 + 2)."""
FAMILIES = ("vllm:prefix_cache_", "vllm:e2e_request_latency_seconds")
"""The default vLLM families plus one histogram a CPU engine fills (NIXL needs GPUs)."""


def wait_for_line(engine: subprocess.Popen[str], marker: str) -> None:
    """Read the engine's stdout until it prints `marker` (vLLM logs there too)."""
    assert engine.stdout is not None
    tail: list[str] = []
    for line in engine.stdout:
        if line.strip() == marker:
            return
        tail = [*tail[-40:], line]
    raise AssertionError(f"engine exited before {marker!r}:\n{''.join(tail)}")


def expected_rows(frames: dict[int, bytes]) -> list[tuple]:
    """kv_block_events rows the collector should write for these engine frames."""
    rows = []
    for seq in sorted(frames):
        batch = decode_engine_payload(frames[seq], "vllm")
        for index, event in enumerate(batch.events):
            if isinstance(event, AllBlocksCleared):
                rows.append((seq, index, 0, "cleared", 0))
                continue
            kind = "stored" if type(event).__name__ == "BlockStored" else "removed"
            rows.extend((seq, index, p, kind, h) for p, h in enumerate(event.block_hashes))
    return rows


@pytest.mark.vllm
def test_real_vllm_through_bridge_and_collector_equals_a_direct_subscriber(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    pub_url, replay_url = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    go = tmp_path / "go"
    engine = subprocess.Popen(
        [sys.executable, str(ENGINE), str(tiny_llama), pub_url, replay_url,
         "kv@10.1.2.3:8000@tiny-llama", str(go), metrics_url.split(":")[2].split("/")[0]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    metrics_source = kafka.for_source(Source(instance="10.1.2.3:8000", model="tiny-llama"))
    scraper = MetricsScraper(metrics_url, metrics_source.publish, FAMILIES, interval_s=0.5)
    truth = DirectSubscriber(pub_url)
    bridge = None
    try:
        wait_for_line(engine, "ready")
        scraper.scrape_once()  # the baseline, before any request
        scraper.start()
        time.sleep(0.3)
        go.touch()
        wait_for(lambda: len(truth.frames) >= 3, timeout_s=60)
        config = BridgeConfig(engine="vllm", endpoints=[Endpoint(zmq=pub_url, replay=replay_url)])
        bridge = Bridge(config, kafka.for_source, kafka.flush).start()
        wait_for_line(engine, "done")
        wait_for(lambda: bridge.state.get(pub_url) == max(truth.frames) + 1, timeout_s=30)
        scraper.stop()
        scraper.scrape_once()  # the final interval
        with urllib.request.urlopen(metrics_url) as response:
            final = parse_series(response.read().decode(), FAMILIES)
    finally:
        scraper.stop()
        if bridge is not None:
            bridge.stop()
        truth.close()
        engine.kill()
        engine.wait()
    assert kafka.shutdown(10)
    assert sorted(truth.frames) == list(range(len(truth.frames)))

    migrate(clickhouse, parse_target(clickhouse_url))
    collector = CollectorConfig(
        bootstrap_servers=bootstrap_servers,
        target=parse_target(clickhouse_url),
        group=f"g-{topic_prefix}",
        topic_prefix=topic_prefix,
        session_timeout_ms=3000,
        batch_seconds=0.3,
        exit_when_idle=2.0,
    )
    asyncio.run(Collector(collector, sink=ClickHouseSink(clickhouse)).run())

    rows = clickhouse.query(
        "SELECT seq, event_index, position, toString(event), block_hash FROM kv_block_events"
        " ORDER BY seq, event_index, position"
    ).result_rows
    assert [tuple(r) for r in rows] == expected_rows(truth.frames)
    sources = clickhouse.query(
        "SELECT DISTINCT instance, model, engine, dp_rank FROM kv_block_events"
    ).result_rows
    assert sources == [("10.1.2.3:8000", "tiny-llama", "vllm", 0)]
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]
    kinds = {r[3] for r in rows}
    assert kinds == {"stored", "removed", "cleared"}

    histogram = clickhouse.query(
        "SELECT sum(count_delta), sum(arraySum(bucket_deltas)), count() FROM engine_histograms"
        " WHERE metric = 'vllm:e2e_request_latency_seconds'"
    ).result_rows
    assert histogram[0][:2] == (REQUESTS, REQUESTS)
    assert histogram[0][2] >= 2, "at least the running and the final scrape"
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        increase = clickhouse.query(
            "SELECT sum(value) FROM engine_histograms WHERE metric = {m:String}",
            parameters={"m": name},
        ).result_rows[0][0]
        scraped = sum(v.value for (metric, _), v in final.items() if metric == name)
        assert increase == scraped > 0
    quantiles = run_query(clickhouse, "engine_histogram_quantiles", {"bucket_s": 3600})
    assert [q["metric"] for q in quantiles] == ["vllm:e2e_request_latency_seconds"]
    assert sum(q["observations"] for q in quantiles) == REQUESTS
    assert all(0 < q["p50"] <= q["p90"] <= q["p99"] for q in quantiles)
    buckets = run_query(clickhouse, "engine_histogram_buckets", {"bucket_s": 3600})
    assert sum(b["observations"] for b in buckets) == REQUESTS
    counters = run_query(clickhouse, "engine_histogram_counters", {"bucket_s": 3600})
    by_metric = {c["metric"]: c for c in counters}
    assert (
        by_metric["vllm:prefix_cache_hits"]["increase"]
        <= by_metric["vllm:prefix_cache_queries"]["increase"]
    )

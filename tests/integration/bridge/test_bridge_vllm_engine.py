"""Real vLLM API server (no kvscope plugin) -> ZMQ -> bridge -> Kafka -> collector -> chDB.

The server runs as a subprocess (like an unmodified engine pod) with KV events on; a
direct ZMQ subscriber connected before any request records the ground truth. The bridge
starts late on purpose (after the engine's first batches), so its first records come
from vLLM's replay socket. The server's own /metrics is scraped into engine-histograms.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from kvscope.local.broker import free_port
from kvscope.local.demo_vllm import offline_vllm_env
from kvscope.local.processes import stop_process, wait_healthy
from kvscope.publisher.bridge.loop import Bridge, BridgeConfig, Endpoint
from kvscope.publisher.bridge.scrape import MetricsScraper, parse_series
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import Source
from support.e2e_support import (
    DirectSubscriber,
    api_server_command,
    collect,
    wait_for,
)
from support.engine_truth import block_rows, vllm_events
from support.histogram_math import exposed_buckets, quantile_row

MODEL = "tiny-llama"
REQUESTS = 8
"""Requests the test sends (3 + 3 + 2)."""
FAMILIES = ("vllm:prefix_cache_", "vllm:e2e_request_latency_seconds")
"""The default vLLM families plus one histogram a CPU engine fills (NIXL needs GPUs)."""


def start_server(model_dir: Path, tmp: Path, port: int, pub: str, replay: str) -> subprocess.Popen:
    """`python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs) on loopback."""
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": pub,
        "replay_endpoint": replay,
        "topic": f"kv@10.1.2.3:8000@{MODEL}",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env.update(offline_vllm_env(tmp))
    env["VLLM_PLUGINS"] = ""  # load no vLLM plugin: kvscope's own is installed here
    env["VLLM_SERVER_DEV_MODE"] = "1"  # for POST /reset_prefix_cache
    with (tmp / "server.log").open("wb") as log:
        return subprocess.Popen(
            api_server_command(model_dir, port, MODEL, events),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def http(base: str, path: str, body: dict | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def complete(base: str, prompts: list[list[int]]) -> None:
    """Send the prompts concurrently (so the engine batches them)."""
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0.0}
    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(lambda p: http(base, "/v1/completions", {**body, "prompt": p}), prompts))


def expected_rows(frames: dict[int, bytes]) -> list[tuple]:
    """kv_block_events rows for these engine frames, decoded with vLLM's own structs."""
    return block_rows({seq: vllm_events(payload) for seq, payload in frames.items()})


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
    port = free_port()
    base, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics"
    server = start_server(tiny_llama, tmp_path, port, pub_url, replay_url)
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    metrics_source = kafka.for_source(Source(instance="10.1.2.3:8000", model=MODEL))
    scraper = MetricsScraper(metrics_url, metrics_source.publish, FAMILIES, interval_s=0.5)
    truth = DirectSubscriber(pub_url)
    bridge = None
    shared = list(range(3, 99))
    prompts = [shared + [200 + i] * (40 + 16 * i) for i in range(6)]
    try:
        wait_healthy(server, base, tmp_path / "server.log", timeout_s=240)
        scraper.scrape_once()  # the baseline, before any request
        scraper.start()
        complete(base, prompts[:3])
        wait_for(lambda: len(truth.frames) >= 1, timeout_s=30)
        config = BridgeConfig(engine="vllm", endpoints=[Endpoint(zmq=pub_url, replay=replay_url)])
        bridge = Bridge(config, kafka.for_source, kafka.flush).start()
        http(base, "/reset_prefix_cache", {})
        complete(base, prompts[3:])
        complete(base, prompts[:2])
        time.sleep(0.5)  # vLLM's publisher thread sends the last batches
        wait_for(lambda: bridge.state.get(pub_url) == max(truth.frames) + 1, timeout_s=30)
        scraper.stop()
        scraper.scrape_once()  # the final interval
        final_text = http(base, "/metrics").decode()
        final = parse_series(final_text, FAMILIES)
    finally:
        scraper.stop()
        if bridge is not None:
            bridge.stop()
        truth.close()
        stop_process(server, grace_s=20)
    assert kafka.shutdown(10)
    assert sorted(truth.frames) == list(range(len(truth.frames)))

    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)

    rows = clickhouse.query(
        "SELECT seq, event_index, position, toString(event), block_hash FROM kv_block_events"
        " ORDER BY seq, event_index, position"
    ).result_rows
    assert [tuple(r) for r in rows] == expected_rows(truth.frames)
    sources = clickhouse.query(
        "SELECT DISTINCT instance, model, engine, dp_rank FROM kv_block_events"
    ).result_rows
    assert sources == [("10.1.2.3:8000", MODEL, "vllm", 0)]
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
    # one time bucket (anything before 2096): one row, the whole run
    quantiles = run_query(clickhouse, "engine_histogram_quantiles", {"bucket_s": 4_000_000_000})
    assert [q["metric"] for q in quantiles] == ["vllm:e2e_request_latency_seconds"]
    # expected from the server's own final buckets (the baseline scrape saw them empty)
    want = quantile_row(*exposed_buckets(final_text, "vllm:e2e_request_latency_seconds"))
    assert want["observations"] == REQUESTS
    assert {k: quantiles[0][k] for k in want} == want
    buckets = run_query(clickhouse, "engine_histogram_buckets", {"bucket_s": 3600})
    assert sum(b["observations"] for b in buckets) == REQUESTS
    counters = run_query(clickhouse, "engine_histogram_counters", {"bucket_s": 3600})
    by_metric = {c["metric"]: c for c in counters}
    assert (
        by_metric["vllm:prefix_cache_hits"]["increase"]
        <= by_metric["vllm:prefix_cache_queries"]["increase"]
    )
    scraped_completeness = [
        row["completeness"]
        for row in run_query(clickhouse, "completeness", {})
        if row["stream"] == "engine-histograms"
    ]
    assert scraped_completeness and all(c == 1.0 for c in scraped_completeness)

"""Scraped Prometheus series -> EngineMetric deltas, on prometheus-client's own exposition."""

from __future__ import annotations

from kvscope.publisher.bridge.scrape import SGLANG_FAMILIES, VLLM_FAMILIES, delta, parse_series
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def series_deltas(before: str, after: str, prefixes: tuple[str, ...]) -> dict[str, object]:
    old, new = parse_series(before, prefixes), parse_series(after, prefixes)
    return {
        key[0] + str(dict(key[1])): delta(key[0], dict(key[1]), cur, old.get(key), 2.0)
        for key, cur in new.items()
    }


def test_vllm_families_become_bucket_and_counter_deltas() -> None:
    registry = CollectorRegistry()
    xfer = Histogram(
        "vllm:nixl_xfer_time_seconds",
        "",
        ["model_name", "engine"],
        buckets=(0.001, 0.01, 0.1),
        registry=registry,
    )
    queries = Counter("vllm:prefix_cache_queries", "", ["engine"], registry=registry)
    Gauge("vllm:num_requests_running", "", registry=registry).set(3)  # not selected
    child = xfer.labels("m", "0")
    child.observe(0.005)
    queries.labels("0").inc(100)
    before = exposition(registry)
    for value in (0.0005, 0.005, 0.05, 0.5, 0.5):
        child.observe(value)
    queries.labels("0").inc(32)
    out = series_deltas(before, exposition(registry), VLLM_FAMILIES)
    assert set(out) == {
        "vllm:nixl_xfer_time_seconds{'engine': '0', 'model_name': 'm'}",
        "vllm:prefix_cache_queries{'engine': '0'}",
    }
    hist = out["vllm:nixl_xfer_time_seconds{'engine': '0', 'model_name': 'm'}"]
    assert hist.bounds == [0.001, 0.01, 0.1]
    assert hist.bucket_deltas == [1, 1, 1, 2]
    assert hist.count_delta == 5
    assert abs(hist.sum_delta - 1.0555) < 1e-9
    counter = out["vllm:prefix_cache_queries{'engine': '0'}"]
    assert (counter.kind, counter.value, counter.interval_s) == ("counter", 32.0, 2.0)


def test_sglang_gauges_and_a_restarted_engine() -> None:
    registry = CollectorRegistry()
    latency = Histogram("sglang:kv_transfer_latency_ms", "", buckets=(10, 100), registry=registry)
    queue = Gauge("sglang:num_decode_transfer_queue_reqs", "", registry=registry)
    for value in (5, 50, 500):
        latency.observe(value)
    queue.set(7)
    before = exposition(registry)
    restarted = CollectorRegistry()  # the engine restarted: its counts start from zero
    latency = Histogram("sglang:kv_transfer_latency_ms", "", buckets=(10, 100), registry=restarted)
    Gauge("sglang:num_decode_transfer_queue_reqs", "", registry=restarted).set(2)
    latency.observe(50)
    out = series_deltas(before, exposition(restarted), SGLANG_FAMILIES)
    hist = out["sglang:kv_transfer_latency_ms{}"]
    assert (hist.bucket_deltas, hist.count_delta, hist.sum_delta) == ([0, 1, 0], 1, 50.0)
    gauge = out["sglang:num_decode_transfer_queue_reqs{}"]
    assert (gauge.kind, gauge.value) == ("gauge", 2.0)

"""Engine histogram quantiles, bridge scrape -> Kafka -> collector -> chDB, against arithmetic.

An engine's /metrics is served by prometheus-client (what vLLM and SGLang use) from a
real `Histogram` the test observes known values into, over two or three scrape intervals.
The bridge's `MetricsScraper` publishes the interval deltas through the real broker, the
real collector writes them, and `engine_histogram_quantiles` reads them back. The
expected row is computed here from the observed values alone (bucket counts by `le`,
then Prometheus' `histogram_quantile` interpolation as the query documents it): count,
p50/p90/p99 and the largest bucket are compared with ==, the mean (a float sum the
engine accumulated, then differenced per scrape) to 1e-12 relative.

Shapes, one series (label set) each, scraped together: everything in the first bucket,
values on bucket edges, spills into +Inf, a single observation, many values then few
and few then many.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

import pytest
from kvscope.analytics.queries import run_query
from kvscope.local.broker import free_port
from kvscope.publisher.bridge.scrape import MetricsScraper
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import Source
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from support.e2e_support import collect
from support.histogram_math import quantile_row

METRIC = "vllm:nixl_xfer_time_seconds"
"""A family the scraper keeps by default (vLLM's KV-transfer latency)."""
BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)
ONE_BUCKET_S = 4_000_000_000
"""The query's time bucket: one bucket for anything before 2096, so one row per series."""

SHAPES: dict[str, list[list[float]]] = {
    "first-bucket": [[0.0002, 0.0004], [0.0009]],
    "on-edges": [[0.001, 0.005, 0.005], [0.01, 0.05, 0.1], [0.5, 1.0, 0.0003]],
    "into-inf": [[0.02, 0.3, 2.0], [7.5, 0.004, 3.0]],
    "single": [[], [0.07]],
    "many-then-few": [[0.002 * i for i in range(1, 30)], [0.04, 0.6]],
    "few-then-many": [[0.3, 0.3, 0.3, 0.9], [0.0001 * i for i in range(1, 100)]],
}
"""Per series (label `peer`), the values observed in each scrape interval."""


def expected_row(values: list[float]) -> dict[str, float]:
    """What the query must say about these observations, from the values alone."""
    counts = [0] * (len(BOUNDS) + 1)  # the last one is +Inf
    for value in values:
        counts[bisect.bisect_left(BOUNDS, value)] += 1  # le is inclusive
    return {**quantile_row(BOUNDS, counts), "mean": sum(values) / len(values)}


@pytest.fixture
def engine_metrics() -> Iterator[tuple[str, Histogram]]:
    """An engine's /metrics on a free loopback port: its URL and the histogram behind it."""
    registry = CollectorRegistry()
    histogram = Histogram(METRIC, "KV transfer time", ["peer"], buckets=BOUNDS, registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{port}/metrics", histogram
    server.shutdown()
    thread.join(10)


def test_scraped_histogram_quantiles_match_the_bucket_arithmetic(
    engine_metrics: tuple[str, Histogram],
    clickhouse: object,
    clickhouse_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
) -> None:
    """Every shape is one series of the histogram, all scraped together (one collector run)."""
    url, histogram = engine_metrics
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix)
    )
    source = kafka.for_source(Source(instance="engine-0", model="m"))
    scraper = MetricsScraper(url, source.publish)
    try:
        for peer in SHAPES:
            histogram.labels(peer=peer)  # the series exist (at zero) before the baseline
        assert scraper.scrape_once() == [], "the first scrape only sets the baseline"
        for step in range(max(len(steps) for steps in SHAPES.values())):
            for peer, steps in SHAPES.items():
                for value in steps[step] if step < len(steps) else []:
                    histogram.labels(peer=peer).observe(value)
            assert len(scraper.scrape_once()) == len(SHAPES)
        assert kafka.flush(20.0), "the scraped deltas were not delivered"
    finally:
        kafka.shutdown(5.0)

    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)
    rows = run_query(clickhouse, "engine_histogram_quantiles", {"bucket_s": ONE_BUCKET_S})
    got = {row["labels"]["peer"]: row for row in rows}
    assert sorted(got) == sorted(SHAPES), "one row per series"
    for peer, steps in SHAPES.items():
        want = expected_row([value for step in steps for value in step])
        row = got[peer]
        assert (row["instance"], row["metric"]) == ("engine-0", METRIC)
        exact = {k: row[k] for k in want if k != "mean"}
        assert exact == {k: v for k, v in want.items() if k != "mean"}, peer
        assert math.isclose(row["mean"], want["mean"], rel_tol=1e-12), peer

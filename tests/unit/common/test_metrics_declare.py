"""`counter`/`gauge`/`histogram`: declare once, reuse after; names, labels, buckets as declared."""

from __future__ import annotations

import pytest
from kvscope.common.metrics import counter, gauge, histogram
from kvscope.publisher.metrics import publisher_metrics
from kvscope.publisher.transfer_timer import LATENCY_BUCKETS, transfer_latency_histogram
from prometheus_client import REGISTRY


def test_a_second_declaration_reuses_the_registered_collector() -> None:
    first = counter("kvscope_test_reuse_total", "test counter", ("kind",))
    assert counter("kvscope_test_reuse_total", "test counter", ("kind",)) is first
    level = gauge("kvscope_test_reuse_level", "test gauge")
    assert gauge("kvscope_test_reuse_level", "test gauge") is level
    timing = histogram("kvscope_test_reuse_seconds", "test histogram", buckets=(1.0, 2.0))
    assert histogram("kvscope_test_reuse_seconds", "test histogram") is timing


def test_a_name_taken_by_another_kind_is_refused() -> None:
    counter("kvscope_test_taken_total", "test counter")
    with pytest.raises(TypeError, match="already registered as a Counter"):
        gauge("kvscope_test_taken_total", "test gauge")


def _bucket_bounds(family: str) -> list[float]:
    for metric in REGISTRY.collect():
        if metric.name == family:
            bounds = {float(s.labels["le"]) for s in metric.samples if s.name.endswith("_bucket")}
            return sorted(bounds)
    raise AssertionError(f"{family} not registered")


def test_histograms_keep_their_buckets() -> None:
    publisher_metrics().send_latency.observe(0.0)
    transfer_latency_histogram().labels(
        backend="b", status="ok", src_instance="p", dst_instance="d"
    ).observe(0.0)
    send = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
    assert _bucket_bounds("kvscope_publisher_send_latency_seconds") == [*send, float("inf")]
    assert _bucket_bounds("kvscope_kv_transfer_latency_seconds") == [
        *LATENCY_BUCKETS,
        float("inf"),
    ]


def test_labelled_metrics_keep_their_label_names() -> None:
    from kvscope.publisher.bridge import metrics as bridge

    metrics = publisher_metrics()
    assert metrics.published._labelnames == ("stream",)
    assert metrics.dropped._labelnames == ("stream", "reason")
    assert metrics.errors._labelnames == ("kind",)
    assert bridge.LOST._labelnames == ("endpoint", "reason")
    assert bridge.REPLAYS._labelnames == ("endpoint", "result")
    assert metrics.queue_capacity._labelnames == ()
    assert transfer_latency_histogram()._labelnames == (
        "backend",
        "status",
        "src_instance",
        "dst_instance",
    )

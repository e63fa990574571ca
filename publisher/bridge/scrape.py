"""Engine /metrics scraping: Prometheus families -> `EngineMetric` interval deltas.

Unmodified engines already keep the KV-transfer and prefix-cache histograms kvscope
wants, but only as cumulative Prometheus series. `MetricsScraper` fetches the engine's
/metrics every interval, parses it with prometheus-client's parser, and publishes one
`EngineMetric` per selected series: per-bucket deltas for histograms, the increase for
counters, the value for gauges. The first scrape only sets the baseline; a series that
went down (the engine restarted) counts from zero again.
"""

from __future__ import annotations

import base64
import itertools
import logging
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvscope.schemas import EngineMetric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

VLLM_FAMILIES = ("vllm:nixl_", "vllm:prefix_cache_", "vllm:external_prefix_cache_")
"""Family-name prefixes scraped from vLLM by default: NIXL transfers, prefix cache."""
SGLANG_FAMILIES = (
    "sglang:kv_transfer_",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:cache_hit_rate",
)
"""Family-name prefixes scraped from SGLang by default: KV transfers, PD queues, cache."""
DEFAULT_FAMILIES = {"vllm": VLLM_FAMILIES, "sglang": SGLANG_FAMILIES}

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class Cumulative:
    """One series as scraped: cumulative bucket counts (per finite `le`), sum, count or value."""

    __slots__ = ("bounds", "buckets", "count", "kind", "sum", "value")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.bounds: list[float] = []
        self.buckets: list[float] = []
        self.sum = 0.0
        self.count = 0.0
        self.value = 0.0


def parse_series(text: str, prefixes: Sequence[str]) -> dict[SeriesKey, Cumulative]:
    """The selected histogram, counter and gauge series of one /metrics text."""
    series: dict[SeriesKey, Cumulative] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in ("histogram", "counter", "gauge"):
            continue
        if not family.name.startswith(tuple(prefixes)) or family.name.endswith("_created"):
            continue  # the text format exposes `*_created` timestamps as separate gauges
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key = (family.name, tuple(sorted(labels.items())))
            entry = series.get(key)
            if entry is None:
                entry = series[key] = Cumulative(family.type)
            _add_sample(entry, family.name, sample)
    for entry in series.values():
        if entry.bounds:
            order = sorted(range(len(entry.bounds)), key=entry.bounds.__getitem__)
            entry.bounds = [entry.bounds[i] for i in order]
            entry.buckets = [entry.buckets[i] for i in order]
    return series


def _add_sample(entry: Cumulative, family: str, sample: Any) -> None:
    suffix = sample.name[len(family) :]
    if entry.kind == "histogram":
        if suffix == "_bucket":
            bound = float(sample.labels["le"])
            if math.isfinite(bound):
                entry.bounds.append(bound)
                entry.buckets.append(sample.value)
        elif suffix == "_sum":
            entry.sum = sample.value
        elif suffix == "_count":
            entry.count = sample.value
    elif suffix in ("", "_total"):
        entry.value = sample.value


def delta(
    metric: str,
    labels: dict[str, str],
    now: Cumulative,
    before: Cumulative | None,
    interval_s: float,
) -> EngineMetric:
    """The change of one series since `before` (None, or gone down: since zero)."""
    if now.kind == "gauge":
        return EngineMetric(
            metric=metric, kind="gauge", labels=labels, value=now.value, interval_s=interval_s
        )
    reset = before is None or now.count < before.count or now.value < before.value
    if now.kind == "counter":
        base = 0.0 if reset or before is None else before.value
        return EngineMetric(
            metric=metric,
            kind="counter",
            labels=labels,
            value=now.value - base,
            interval_s=interval_s,
        )
    if before is not None and before.bounds != now.bounds:
        reset = True
    cumulative = [*now.buckets, now.count]
    previous = (
        [0.0] * len(cumulative) if reset or before is None else [*before.buckets, before.count]
    )
    diffs = [max(0, round(c - p)) for c, p in zip(cumulative, previous, strict=True)]
    per_bucket = [diffs[0], *(max(0, b - a) for a, b in itertools.pairwise(diffs))]
    return EngineMetric(
        metric=metric,
        kind="histogram",
        labels=labels,
        bounds=list(now.bounds),
        bucket_deltas=per_bucket,
        sum_delta=now.sum - (0.0 if reset or before is None else before.sum),
        count_delta=diffs[-1],
        interval_s=interval_s,
    )


MAX_SCRAPE_BYTES = 16 * 1024 * 1024
"""Largest /metrics body parsed (vLLM's is tens of KB); a larger one fails the scrape."""


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """`url` without user:password, and the basic-auth header carrying them (if any)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return parts._replace(netloc=netloc).geturl(), {"Authorization": f"Basic {token}"}


class MetricsScraper:
    """Scrapes one engine /metrics URL on a thread and publishes `EngineMetric` deltas."""

    def __init__(
        self,
        url: str,
        publish: Callable[[EngineMetric], None],
        families: Iterable[str] = VLLM_FAMILIES,
        interval_s: float = 10.0,
        timeout_s: float = 5.0,
    ) -> None:
        """`families`: family-name prefixes to keep; `publish` gets every delta.

        User and password in `url` are sent as HTTP basic auth, never logged: `url` is
        kept without them (`self.url`).
        """
        self.url, self._headers = split_credentials(url)
        self._publish = publish
        self.families = tuple(families)
        self.interval_s = interval_s
        self._timeout_s = timeout_s
        self._last: dict[SeriesKey, Cumulative] = {}
        self._last_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.scrapes = 0
        """Successful scrapes so far."""

    def scrape_once(self) -> list[EngineMetric]:
        """Fetch, diff against the previous scrape, publish and return the deltas."""
        request = urllib.request.Request(self.url, headers=self._headers)
        with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
            body = response.read(MAX_SCRAPE_BYTES + 1)
        if len(body) > MAX_SCRAPE_BYTES:
            raise ValueError(f"/metrics body over {MAX_SCRAPE_BYTES} bytes: not parsed")
        text = body.decode("utf-8", errors="replace")
        now = time.monotonic()
        series = parse_series(text, self.families)
        out: list[EngineMetric] = []
        if self._last_at is not None:
            interval = now - self._last_at
            for key, current in series.items():
                metric, labels = key
                out.append(delta(metric, dict(labels), current, self._last.get(key), interval))
        self._last, self._last_at = series, now
        for record in out:
            self._publish(record)
        self.scrapes += 1
        return out

    def start(self) -> MetricsScraper:
        """Scrape every `interval_s` on a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="kvscope-scrape", daemon=True)
        self._thread.start()
        log.info(
            "scraping %s every %.1fs (%s)", self.url, self.interval_s, ", ".join(self.families)
        )
        return self

    def stop(self) -> None:
        """Stop the thread (safe before `start()`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout_s + 1)
            self._thread = None
            log.info("stopped scraping %s after %d scrapes", self.url, self.scrapes)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.scrape_once()
                if failing:
                    log.info("scraping %s works again", self.url)
                failing = False
            except (OSError, ValueError) as exc:
                if not failing:
                    log.warning("scraping %s failed: %s (retrying quietly)", self.url, exc)
                failing = True
            self._stop.wait(self.interval_s)

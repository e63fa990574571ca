"""Freshness through `kvscope serve`: time from `publish()` to queryable, at set event rates.

Starts the local broker and a `kvscope serve` subprocess (default collector settings,
fresh chDB directory), then for each rate publishes KV-event batches (8 events x 8 block
hashes = 64 block events each, 8 sources) through the real `KafkaPublisher`, paced in
10 ms ticks, for `--seconds`. A poller asks the serve's API (`/api/query/report_span`,
a named query) every `--poll-ms` how many block events are stored. Every batch's latency
is the first poll answer whose count covers it, minus its `publish()` time (an upper
bound: a poll's own duration is included). The lowest rate is the baseline; the others
are also given as ratios to it. A short unmeasured warm-up first lets the topics appear and
the collector join them. Usage: python bench/freshness.py [--rates 1000,10000,100000]
[--seconds 15] [--poll-ms 100]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from collector_throughput import kv_event_batch  # bench/ is on the path when run as a script
from kvscope.collector.storage.tables import KV_BLOCK_EVENTS
from kvscope.local.broker import LocalBroker
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import Source
from kvscope.serve.state import read_state

EVENTS_PER_BATCH = 8
HASHES_PER_EVENT = 8
BLOCK_EVENTS_PER_BATCH = EVENTS_PER_BATCH * HASHES_PER_EVENT
SOURCES = 8


def start_serve(bootstrap: str, chdb_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """A `kvscope serve` subprocess on a free port; (process, URL) once it answers."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kvscope.cli", "serve",
             "--bootstrap-servers", bootstrap, "--clickhouse", f"chdb://{chdb_dir}",
             "--topic-prefix", "fresh.", "--group", "fresh", "--port", "0"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = read_state(chdb_dir)
        if state is not None and state.pid == process.pid:
            return process, state.url
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"kvscope serve did not start:\n{log_path.read_text()}")


def stored_block_events(url: str, since: str, until: str) -> int:
    """Block events stored, through the serve's named-query API."""
    query = f"since={since}&until={until}"
    with urllib.request.urlopen(f"{url}/api/query/report_span?{query}", timeout=30) as reply:
        rows = json.loads(reply.read())["rows"]
    return next(int(r["rows"]) for r in rows if r["table"] == KV_BLOCK_EVENTS.name)


class Poller(threading.Thread):
    """Polls the stored count; keeps (answer time, count) pairs."""

    def __init__(self, url: str, since: str, until: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.since, self.until, self.interval_s = url, since, until, interval_s
        self.samples: list[tuple[float, int]] = []
        self.query_s: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.time()
            count = stored_block_events(self.url, self.since, self.until)
            answered = time.time()
            self.samples.append((answered, count))
            self.query_s.append(answered - started)
            self.stop.wait(max(0.0, self.interval_s - (answered - started)))


def measure(bootstrap: str, url: str, rate: int, seconds: float, poll_s: float, seed: int) -> dict:
    """Publish at `rate` block events/s for `seconds`; latency percentiles in seconds."""
    publisher = KafkaPublisher(PublisherConfig(bootstrap_servers=bootstrap, topic_prefix="fresh."))
    sources = [
        publisher.for_source(Source(instance=f"fresh-{seed}-{i}", model="m"), epoch=seed)
        for i in range(SOURCES)
    ]
    rng = random.Random(seed)
    before_run = time.time()
    since = datetime.fromtimestamp(before_run - 1, UTC).replace(tzinfo=None).isoformat()
    until = (datetime.now(UTC) + timedelta(hours=1)).replace(tzinfo=None).isoformat()
    baseline = stored_block_events(url, since, until)
    poller = Poller(url, since, until, poll_s)
    poller.start()
    published: list[tuple[float, int]] = []  # (publish time, cumulative block events)
    total, n = 0, 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate / BLOCK_EVENTS_PER_BATCH) + 1
        while n < due:
            now = time.time()
            body = kv_event_batch(rng, now, EVENTS_PER_BATCH, HASHES_PER_EVENT)
            sources[n % SOURCES].publish(body, ts=now)
            total += BLOCK_EVENTS_PER_BATCH
            published.append((now, total))
            n += 1
        time.sleep(0.01)
    achieved = total / (time.monotonic() - start)
    publisher.shutdown(60)
    deadline = time.monotonic() + 60
    while (not poller.samples or poller.samples[-1][1] - baseline < total) and (
        time.monotonic() < deadline
    ):
        time.sleep(poll_s)
    poller.stop.set()
    poller.join()
    times = [t for t, _ in poller.samples]
    counts = [c - baseline for _, c in poller.samples]
    latencies = []
    for published_at, cumulative in published:
        i = bisect.bisect_left(counts, cumulative)  # counts only grow: stored prefixes
        if i < len(counts):
            latencies.append(times[i] - published_at)
    lost = len(published) - len(latencies)
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {
        "rate": rate,
        "achieved": achieved,
        "batches": len(published),
        "unseen": lost,
        "p50": q[49],
        "p99": q[98],
        "max": max(latencies, default=float("nan")),
        "poll_query_ms": 1000 * statistics.median(poller.query_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rates", default="1000,10000,100000", help="block events/s, first = baseline"
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--poll-ms", type=float, default=100.0)
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    load = os.getloadavg()
    with LocalBroker() as broker, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        process, url = start_serve(
            broker.bootstrap_servers, Path(tmp) / "chdb", Path(tmp) / "serve.log"
        )
        try:
            # Warm-up (not measured): topics get created and the collector's group joins them,
            # including engine-histograms, which nobody publishes (one more rebalance).
            measure(broker.bootstrap_servers, url, 1000, 2.0, args.poll_ms / 1000, 99)
            log_path = Path(tmp) / "serve.log"
            deadline = time.monotonic() + 60
            while "assigned fresh.engine-histograms[" not in log_path.read_text():
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"the collector never joined every topic:\n{log_path.read_text()}"
                    )
                time.sleep(0.2)
            results = [
                measure(
                    broker.bootstrap_servers, url, rate, args.seconds, args.poll_ms / 1000, i + 1
                )
                for i, rate in enumerate(rates)
            ]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    base = results[0]
    for r in results:
        print(
            f"{r['rate']:>7,} ev/s (achieved {r['achieved']:,.0f}): p50 {r['p50']:.3f} s, "
            f"p99 {r['p99']:.3f} s, max {r['max']:.3f} s; "
            f"vs baseline p50 x{r['p50'] / base['p50']:.2f}, "
            f"p99 x{r['p99'] / base['p99']:.2f}; {r['batches']:,} batches, {r['unseen']} unseen; "
            f"poll query {r['poll_query_ms']:.0f} ms"
        )  # fmt: skip
    print(f"machine   {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"load average before {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, after "
          f"{os.getloadavg()[0]:.1f}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip


if __name__ == "__main__":
    main()

"""Crash test: SIGKILL the collector process at random moments; nothing lost, nothing doubled.

The derived residency must equal its window-function definition afterwards.
The collector runs as a real `kvscope collect` subprocess on its own chDB directory while
records keep arriving. Half of the kills come from this test at random times; the other
half from a fault injector inside the collector process that SIGKILLs it right before or
right after its n-th insert lands (the window between insert and commit is too narrow to
hit by chance).
chDB allows one data directory per process, so this test process never opens that
directory: the final check runs in another subprocess that prints the tables as JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kvscope.collector.analytics.queries import _read, _strip_comments
from kvscope.schemas import AllBlocksCleared, BlockStored, Source
from support.collector_testkit import kv_envelopes, kv_row_count, publish_envelopes

RECORDS_PER_SOURCE = 3_200
SOURCES = [Source(instance=f"crash-{i}", model="m", dp_rank=i) for i in range(2)]
KILLS = 6

_DUMP = r"""
import json, sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
client.database = "kvscope"
out = {}
for name, sql in json.loads(sys.argv[2]).items():
    out[name] = [list(map(str, row)) for row in client.query(sql).result_rows]
print(json.dumps(out))
"""
QUERIES = {
    "kv": "SELECT instance, seq, event_index, position, toString(event), block_hash, medium"
    " FROM kv_block_events",
    "agg": "SELECT instance, medium, sum(stores), sum(removals), sum(clears)"
    " FROM kv_block_events_1m GROUP BY instance, medium",
    "gaps": "SELECT count() FROM stream_gaps",
    "errors": "SELECT count() FROM ingest_errors",
}
WINDOW = {
    "since": "toDateTime64('1970-01-01 00:00:00', 6)",
    "until": "toDateTime64('2100-01-01 00:00:00', 6)",
    "model": "''",
}


def _intervals_sql(fragment: str) -> str:
    """All residency intervals by `fragment` (derived tables or the window definition)."""
    sql = (
        f"WITH {_strip_comments(_read(fragment))} SELECT instance, epoch, medium, block_hash, "
        "start_ts, end_kind, end_ts, refault, refault_distance, store_ord, removal_ord "
        "FROM block_intervals"
    )
    for name, value in WINDOW.items():
        sql = re.sub(rf"\{{{name}:[^}}]+\}}", value, sql)
    return sql


QUERIES["derived"] = _intervals_sql("_block_intervals")
QUERIES["definition"] = _intervals_sql("_block_intervals_raw")


def _expected(envelopes: list) -> tuple[Counter, Counter]:
    rows: Counter = Counter()
    agg: Counter = Counter()
    for env in envelopes:
        inst = env.source.instance
        for ei, ev in enumerate(env.body.events):
            if isinstance(ev, AllBlocksCleared):
                rows[(inst, str(env.seq), str(ei), "0", "cleared", "0", "")] += 1
                agg[(inst, "", "clears")] += 1
                continue
            kind = "stored" if isinstance(ev, BlockStored) else "removed"
            for pos, h in enumerate(ev.block_hashes):
                rows[(inst, str(env.seq), str(ei), str(pos), kind, str(h), ev.medium)] += 1
                agg[(inst, ev.medium, "stores" if kind == "stored" else "removals")] += 1
    return rows, agg


_SELF_KILLING = r"""
import asyncio, os, signal, sys
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.storage.target import parse_target
from kvscope.collector.pipeline.write import ClickHouseSink

bootstrap, url, prefix, at, when = sys.argv[1:6]


class SelfKillingSink:
    # Fault injector at the writer boundary: SIGKILLs this process at insert number
    # `at`, before it reaches ClickHouse or right after it landed (before the commit).
    def __init__(self, real):
        self.real, self.count = real, 0

    def insert(self, insert):
        self.count += 1
        if self.count == int(at) and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        self.real.insert(insert)
        if self.count == int(at) and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    def resume_state(self, *args):
        return self.real.resume_state(*args)


target = parse_target(url)
real = ClickHouseSink.open(target)
migrate(real.client, target)
config = CollectorConfig(
    bootstrap_servers=bootstrap, target=target, group="g-" + prefix, topic_prefix=prefix,
    batch_rows=1000, batch_seconds=0.1, session_timeout_ms=2000,
)
asyncio.run(Collector(config, sink=SelfKillingSink(real)).run())
"""


def _start_self_killing(
    bootstrap: str, url: str, prefix: str, log: Path, at: int, when: str
) -> subprocess.Popen:
    cmd = [sys.executable, "-c", _SELF_KILLING, bootstrap, url, prefix, str(at), when]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _start(bootstrap: str, url: str, prefix: str, log: Path, idle: bool) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "kvscope.collector.cli", "--log-level", "WARNING", "collect",
        "--bootstrap-servers", bootstrap, "--clickhouse", url, "--group", f"g-{prefix}",
        "--topic-prefix", prefix, "--batch-rows", "1000", "--batch-seconds", "0.1",
        "--session-timeout-ms", "2000",
    ]  # fmt: skip
    if idle:
        cmd += ["--exit-when-idle", "3"]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _paced_publish(bootstrap: str, prefix: str, envelopes: list, seconds: float) -> None:
    """Publish `envelopes` evenly over `seconds`, so every kill lands mid-stream."""

    async def run() -> None:
        chunks = 100
        size = -(-len(envelopes) // chunks)
        for i in range(chunks):
            chunk = envelopes[i * size : (i + 1) * size]
            await publish_envelopes(bootstrap, prefix, "kv-events", chunk)
            await asyncio.sleep(seconds / chunks)

    asyncio.run(run())


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(1234)
    data_dir = tmp_path / "chdb"
    url = f"chdb://{data_dir}"
    log = tmp_path / "collector.log"
    per_source = [
        kv_envelopes(src, epoch=99 + i, records=RECORDS_PER_SOURCE, seed=i)
        for i, src in enumerate(SOURCES)
    ]
    everything = [e for pair in zip(*per_source, strict=True) for e in pair]
    assert kv_row_count(everything) >= 200_000
    publisher = threading.Thread(
        target=_paced_publish, args=(bootstrap_servers, topic_prefix, everything, 20.0)
    )
    publisher.start()
    kills = 0
    try:
        for k in range(KILLS):
            if k % 2:
                when = "after" if k % 4 == 1 else "before"
                process = _start_self_killing(
                    bootstrap_servers, url, topic_prefix, log, rng.randint(2, 6), when
                )
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                assert process.returncode == -signal.SIGKILL, log.read_text()[-3000:]
            else:
                process = _start(bootstrap_servers, url, topic_prefix, log, idle=False)
                time.sleep(rng.uniform(2.5, 4.5))
                assert process.poll() is None, log.read_text()[-3000:]
                process.send_signal(signal.SIGKILL)
                process.wait()
            kills += 1
    finally:
        publisher.join()
    process = _start(bootstrap_servers, url, topic_prefix, log, idle=True)
    assert process.wait(timeout=90) == 0, log.read_text()[-3000:]
    assert kills >= 5

    dump = subprocess.run(
        [sys.executable, "-c", _DUMP, str(data_dir), json.dumps(QUERIES)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    tables = json.loads(dump.stdout)
    rows, agg = _expected(everything)
    stored = Counter(tuple(r) for r in tables["kv"])
    assert sum(stored.values()) == sum(rows.values())
    assert stored == rows
    stored_agg: Counter = Counter()
    for inst, medium, stores, removals, clears in tables["agg"]:
        for kind, n in (("stores", stores), ("removals", removals), ("clears", clears)):
            if int(n):
                stored_agg[(inst, medium, kind)] += int(n)
    assert stored_agg == agg
    assert tables["gaps"] == [["0"]]
    assert tables["errors"] == [["0"]]
    # The residency the collectors derived (refreshes killed mid-way included) equals the
    # window-function definition over the stored events.
    assert tables["definition"]
    assert Counter(map(tuple, tables["derived"])) == Counter(map(tuple, tables["definition"]))

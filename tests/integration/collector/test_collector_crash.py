"""Crash test: SIGKILL the collector process at random moments; nothing lost, nothing doubled.

The collector runs as a real `kvscope collect` subprocess on its own chDB directory.
chDB allows one data directory per process, so this test process never opens that
directory: the final check runs in another subprocess that prints the tables as JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from collector_testkit import kv_envelopes, kv_row_count, publish_envelopes
from kvscope.schemas import AllBlocksCleared, BlockStored, Source

RECORDS_PER_SOURCE = 3_200
SOURCES = [Source(instance=f"crash-{i}", model="m", dp_rank=i) for i in range(2)]
PHASES = 6

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


def _start(bootstrap: str, url: str, prefix: str, log: Path, idle: bool) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "kvscope.collector.cli", "--log-level", "WARNING", "collect",
        "--bootstrap-servers", bootstrap, "--clickhouse", url, "--group", f"g-{prefix}",
        "--topic-prefix", prefix, "--batch-rows", "4000", "--batch-seconds", "0.2",
        "--session-timeout-ms", "2000",
    ]  # fmt: skip
    if idle:
        cmd += ["--exit-when-idle", "3"]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


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
    everything = [e for envs in per_source for e in envs]
    assert kv_row_count(everything) >= 200_000
    step = RECORDS_PER_SOURCE // PHASES

    kills = 0
    for phase in range(PHASES + 1):
        chunk = [e for envs in per_source for e in envs[phase * step : (phase + 1) * step]]
        if phase == PHASES:
            chunk = [e for envs in per_source for e in envs[phase * step :]]
        asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", chunk))
        last = phase == PHASES
        process = _start(bootstrap_servers, url, topic_prefix, log, idle=last)
        if last:
            assert process.wait(timeout=90) == 0, log.read_text()[-3000:]
            break
        time.sleep(rng.uniform(2.0, 4.5))
        assert process.poll() is None, log.read_text()[-3000:]
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
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

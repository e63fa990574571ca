"""Crash test: SIGKILL the collector process six times; nothing lost, nothing doubled.

The collector runs as a real subprocess on its own chDB directory while records keep
arriving. Three kills come from this test at a random moment after the run's first insert
landed (seen on the collector's /metrics); three from a fault injector inside the process
that SIGKILLs it right before or right after its n-th insert lands (the window between
insert and commit is too narrow to hit by chance), or between the insert's raw part and
its view part (a random kill met that window once; see test_collector_views_journal.py).
The injector leaves evidence: before killing it appends a marker (which insert, when,
the table and the Kafka positions of its rows), and after each kill the test checks that
those rows are absent (before) or all present (after, between), and that the run stored
rows. The streams carry holes, silent ones and ones a publisher `Gap` declares; each
must end up as exactly one stream_gaps row per detector however the kills split the
stream.

The derived residency must equal its window-function definition afterwards.
chDB allows one data directory per process, so this test process never opens that
directory: every check runs in another subprocess that prints the tables as JSON.
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
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kvscope.analytics.queries import fragment
from kvscope.local.broker import free_port
from kvscope.schemas import AllBlocksCleared, BlockStored, KVEventBatch, Source
from support.collector_testkit import kv_envelopes, kv_row_count, publish_envelopes, punch_holes

RECORDS_PER_SOURCE = 3_250
SOURCES = [Source(instance=f"crash-{i}", model="m", dp_rank=i) for i in range(2)]
KILLS = [
    ("random", 0, ""),
    ("injected", 4, "after"),
    ("random", 0, ""),
    ("injected", 2, "before"),
    ("random", 0, ""),
    ("injected", 6, "between"),
]
"""The planned kills in order: who kills, and for the injector at which insert and when."""
HOLES = [
    (150, 151, False),
    (700, 700, True),
    (1_300, 1_304, False),
    (1_900, 1_902, True),
    (2_500, 2_500, False),
    (3_000, 3_005, True),
]
"""Per source: (first seq, last seq, declared by a publisher Gap), spread over every phase."""
RUN_TIMEOUT_S = 120.0
"""Generous bound on one run reaching its kill point.

An injected kill needs `at` inserts: each run starts with a backlog of ~460 records per
source, and the injected collector polls at most 50 records (~1,500 rows, over its
`batch_rows` of 1,000) at a time, so the backlog alone is more than six inserts.
"""

_DUMP = r"""
import json, sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
client.database = "kvscope"
out = {}
for name, sql in json.loads(sys.argv[2]).items():
    out[name] = [list(map(str, row)) for row in client.query(sql).result_rows]
print(json.dumps(out))
"""
FINAL_QUERIES = {
    "kv": "SELECT instance, seq, event_index, position, toString(event), block_hash, medium"
    " FROM kv_block_events",
    "agg": "SELECT instance, medium, sum(stores), sum(removals), sum(clears)"
    " FROM kv_block_events_1m GROUP BY instance, medium",
    "gaps": "SELECT instance, detected_by, first_seq, last_seq, seq, reason FROM stream_gaps",
    "errors": "SELECT count() FROM ingest_errors",
}
STORED = "SELECT (SELECT count() FROM kv_block_events) + (SELECT count() FROM stream_gaps)"

WINDOW = {
    "since": "toDateTime64('1970-01-01 00:00:00', 6)",
    "until": "toDateTime64('2100-01-01 00:00:00', 6)",
    "model": "''",
}


def _intervals_sql(name: str) -> str:
    """All residency intervals by the fragment `name` (derived tables or the definition)."""
    sql = (
        f"WITH {fragment(name)} SELECT instance, epoch, medium, block_hash, "
        "start_ts, end_kind, end_ts, refault, refault_distance, store_ord, removal_ord "
        "FROM block_intervals"
    )
    for name, value in WINDOW.items():
        sql = re.sub(rf"\{{{name}:[^}}]+\}}", value, sql)
    return sql


FINAL_QUERIES["derived"] = _intervals_sql("block_intervals")
FINAL_QUERIES["definition"] = _intervals_sql("block_intervals_raw")

_SELF_KILLING = r"""
import asyncio, json, os, signal, sys
import pyarrow.compute as pc
from kvscope.collector.pipeline.config import CollectorConfig
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.storage.target import parse_target
from kvscope.collector.pipeline.write import ClickHouseSink

bootstrap, url, prefix, at, when, marker = sys.argv[1:7]


class SelfKillingSink:
    # Fault injector at the writer boundary (a real process cannot be made to die at an
    # exact insert otherwise): SIGKILLs this process at insert number `at`, before it
    # reaches ClickHouse or right after it landed (before the commit), and first appends
    # a marker naming the insert and the Kafka positions of its rows.
    def __init__(self, real):
        self.real, self.count = real, 0

    def mark_and_kill(self, insert):
        rows = insert.rows
        ranges = []
        parts = rows.column("_partition")
        for partition in sorted(set(parts.to_pylist())):
            offsets = pc.filter(rows.column("_offset"), pc.equal(parts, partition))
            ranges.append([partition, pc.min(offsets).as_py(), pc.max(offsets).as_py()])
        detected = None
        if "detected_by" in rows.column_names:
            detected = sorted(set(rows.column("detected_by").to_pylist()))
        mark = {"insert": self.count, "when": when, "table": insert.table,
                "rows": rows.num_rows, "ranges": ranges, "detected_by": detected}
        with open(marker, "a") as out:
            out.write(json.dumps(mark) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    def insert(self, insert):
        # Inserts of the tables the test checks count ("between": the block events only);
        # the journal's own inserts (ingest_inserts) pass through uncounted.
        counted = ("kv_block_events",) if when == "between" else ("kv_block_events", "stream_gaps")
        if insert.table not in counted:
            return self.real.insert(insert)
        self.count += 1
        if self.count == int(at) and when == "before":
            self.mark_and_kill(insert)
        if self.count == int(at) and when == "between":
            # The raw part lands, the view's insert fails (a constraint no row meets):
            # the state a SIGKILL during the view's insert leaves.
            fault = "ALTER TABLE kv_block_events_1m {} CONSTRAINT injected_fault"
            self.real.client.command(fault.format("ADD") + " CHECK toUnixTimestamp(minute) = 0")
            try:
                self.real.insert(insert)
            except Exception as exc:
                assert "injected_fault" in str(exc), exc
            else:
                raise AssertionError("the view's insert did not fail")
            self.real.client.command(fault.format("DROP"))
            self.mark_and_kill(insert)
        self.real.insert(insert)
        if self.count == int(at) and when == "after":
            self.mark_and_kill(insert)

    def resume_state(self, *args):
        return self.real.resume_state(*args)


target = parse_target(url)
real = ClickHouseSink.open(target)
migrate(real.client, target)
config = CollectorConfig(
    bootstrap_servers=bootstrap, target=target, group="g-" + prefix, topic_prefix=prefix,
    batch_rows=1000, batch_seconds=0.1, session_timeout_ms=2000, max_poll_records=50,
)
asyncio.run(Collector(config, sink=SelfKillingSink(real)).run())
"""


def _expected_rows(envelopes: list) -> tuple[Counter, Counter]:
    rows: Counter = Counter()
    agg: Counter = Counter()
    for env in envelopes:
        if not isinstance(env.body, KVEventBatch):
            continue
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


def _dump(data_dir: Path, queries: dict[str, str]) -> dict[str, list[list[str]]]:
    """Run `queries` on the chDB directory in another process (no collector may run)."""
    out = subprocess.run(
        [sys.executable, "-c", _DUMP, str(data_dir), json.dumps(queries)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def _window_query(mark: dict[str, Any]) -> str:
    """Count the stored rows of the insert a marker names (its table, Kafka positions)."""
    ranges = " OR ".join(
        f"(_partition = {int(p)} AND _offset BETWEEN {int(a)} AND {int(b)})"
        for p, a, b in mark["ranges"]
    )
    where = f"({ranges})"
    if mark["detected_by"] is not None:
        where += " AND detected_by IN (" + ", ".join(f"'{d}'" for d in mark["detected_by"]) + ")"
    assert mark["table"] in ("kv_block_events", "stream_gaps"), mark
    return f"SELECT count() FROM {mark['table']} WHERE {where}"


def _collect_cmd(bootstrap: str, url: str, prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "kvscope.cli", "--log-level", "WARNING", "collect",
        "--bootstrap-servers", bootstrap, "--clickhouse", url, "--group", f"g-{prefix}",
        "--topic-prefix", prefix, "--batch-rows", "1000", "--batch-seconds", "0.1",
        "--session-timeout-ms", "2000", *extra,
    ]  # fmt: skip


def _rows_inserted(port: int) -> float:
    """Rows the collector's /metrics count in the tables the test checks (the journal's
    own inserts, `ingest_inserts`, come first and do not count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kvscope_collector_rows_inserted_total{")
        and ('table="kv_block_events"' in line or 'table="stream_gaps"' in line)
    )


def _kill_after_first_insert(process: subprocess.Popen, port: int, rng: random.Random) -> None:
    """SIGKILL `process` at a random moment once its /metrics show a stored row."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    inserted = 0.0
    while inserted == 0:
        assert process.poll() is None, "the collector died before it was killed"
        assert time.monotonic() < deadline, f"no insert within {RUN_TIMEOUT_S:.0f} s"
        try:
            inserted = _rows_inserted(port)
        except OSError:
            inserted = 0.0  # the listener is not up yet
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.0))
    assert process.poll() is None, "the collector exited on its own"
    process.send_signal(signal.SIGKILL)
    process.wait()


def _publish_in_thread(bootstrap: str, prefix: str, envelopes: list) -> threading.Thread:
    """Publish `envelopes` in ten paced slices from a thread (records arrive mid-run)."""

    async def run() -> None:
        size = -(-len(envelopes) // 10)
        for i in range(10):
            chunk = envelopes[i * size : (i + 1) * size]
            await publish_envelopes(bootstrap, prefix, "kv-events", chunk)
            await asyncio.sleep(0.2)

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    return thread


def _streams() -> tuple[list, Counter]:
    """Both sources' streams with holes, interleaved, and the gap rows they must leave."""
    streams, gap_rows = [], Counter()
    for i, src in enumerate(SOURCES):
        full = kv_envelopes(src, epoch=99 + i, records=RECORDS_PER_SOURCE, seed=i)
        holey, rows = punch_holes(full, [(a + i * 7, b + i * 7, d) for a, b, d in HOLES])
        streams.append(holey)
        gap_rows.update(
            (
                inst,
                by,
                str(first),
                str(last),
                str(seq),
                "injected" if by == "publisher" else "seq_hole",
            )
            for inst, by, first, last, seq in rows
        )
    shortest = min(len(s) for s in streams)
    everything = [e for pair in zip(*(s[:shortest] for s in streams), strict=True) for e in pair]
    everything += [e for s in streams for e in s[shortest:]]
    return everything, gap_rows


@pytest.mark.slow
def test_sigkill_at_planned_and_random_moments_loses_and_doubles_nothing(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(1234)
    data_dir = tmp_path / "chdb"
    url = f"chdb://{data_dir}"
    log = tmp_path / "collector.log"
    markers = tmp_path / "markers.jsonl"
    everything, gap_rows = _streams()
    assert kv_row_count(everything) >= 200_000
    phases = len(KILLS) + 1
    size = -(-len(everything) // phases)
    chunks = [everything[i * size : (i + 1) * size] for i in range(phases)]
    stored_after_kill = [0]

    def tail() -> str:
        return log.read_text()[-3000:]

    for k, (killer, at, when) in enumerate(KILLS):
        half = len(chunks[k]) // 2
        asyncio.run(
            publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", chunks[k][:half])
        )
        publisher = _publish_in_thread(bootstrap_servers, topic_prefix, chunks[k][half:])
        try:
            if killer == "random":
                port = free_port()
                cmd = _collect_cmd(
                    bootstrap_servers, url, topic_prefix, "--metrics-port", str(port)
                )
                process = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
                try:
                    _kill_after_first_insert(process, port, rng)
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
            else:
                args = [bootstrap_servers, url, topic_prefix, str(at), when, str(markers)]
                process = subprocess.Popen(
                    [sys.executable, "-c", _SELF_KILLING, *args],
                    stdout=log.open("ab"),
                    stderr=subprocess.STDOUT,
                )
                try:
                    process.wait(timeout=RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    pytest.fail(f"kill {k}: insert {at} never came in {RUN_TIMEOUT_S:.0f} s")
            assert process.returncode == -signal.SIGKILL, tail()
        finally:
            publisher.join()

        queries = {"stored": STORED}
        if killer == "injected":
            assert markers.exists(), f"kill {k}: SIGKILLed, but not by the injector"
            marks = [json.loads(line) for line in markers.read_text().splitlines()]
            assert len(marks) == sum(1 for kill in KILLS[: k + 1] if kill[0] == "injected")
            mark = marks[-1]
            assert (mark["insert"], mark["when"]) == (at, when), mark
            queries["window"] = _window_query(mark)
        tables = _dump(data_dir, queries)
        stored = int(tables["stored"][0][0])
        assert stored > stored_after_kill[-1], f"kill {k}: no row stored in the run it ended"
        stored_after_kill.append(stored)
        if killer == "injected":
            in_window = int(tables["window"][0][0])
            assert in_window == (0 if when == "before" else mark["rows"]), (mark, in_window)

    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", chunks[-1]))
    process = subprocess.Popen(
        _collect_cmd(bootstrap_servers, url, topic_prefix, "--exit-when-idle", "3"),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    assert process.wait(timeout=RUN_TIMEOUT_S) == 0, tail()

    tables = _dump(data_dir, FINAL_QUERIES)
    rows, agg = _expected_rows(everything)
    stored_rows = Counter(tuple(r) for r in tables["kv"])
    assert sum(stored_rows.values()) == sum(rows.values())
    assert stored_rows == rows
    stored_agg: Counter = Counter()
    for inst, medium, stores, removals, clears in tables["agg"]:
        for kind, n in (("stores", stores), ("removals", removals), ("clears", clears)):
            if int(n):
                stored_agg[(inst, medium, kind)] += int(n)
    assert stored_agg == agg
    assert Counter(tuple(r) for r in tables["gaps"]) == gap_rows
    assert len(gap_rows) == len(SOURCES) * (len(HOLES) + sum(d for *_, d in HOLES))
    assert tables["errors"] == [["0"]]
    # The residency the collectors derived (refreshes killed mid-way included) equals the
    # window-function definition over the stored events.
    assert tables["definition"]
    assert Counter(map(tuple, tables["derived"])) == Counter(map(tuple, tables["definition"]))

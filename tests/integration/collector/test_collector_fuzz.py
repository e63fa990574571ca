"""Hostile-record fuzz test of the whole collector: `kvscope collect` processes, real broker, chDB.

Every stream gets valid records interleaved with hostile ones (the named attacks of
`support.hostile` and random mutations of valid envelopes: flipped bytes, truncations,
random bytes, tombstones, fields replaced by out-of-range numbers, NaN/inf, huge strings
and lists, wrong body tags). The first collector must stay up through all of them (it is
then SIGKILLed, possibly mid-batch); a restart must store the rest and exit cleanly, a
second restart must change nothing. Afterwards every valid record is stored exactly once,
and every record is in exactly one of the raw tables, `ingest_errors` and `stream_gaps`
(publisher Gaps), found by (_topic, _partition, _offset). The one exception the contract
allows: a KV batch that decodes but has no block rows (no events, or events without
hashes) leaves no row, so the oracle expects it nowhere. Peak RSS of each collector stays
under `RSS_BOUND` (docs/collector.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from kvscope.collector.pipeline.checks import kv_rows
from kvscope.collector.pipeline.decode import FlatKVEnvelope, decode_records
from kvscope.collector.storage.tables import INGEST_ERRORS, STREAM_GAPS, STREAM_TABLES
from kvscope.local.broker import free_port
from kvscope.schemas import STREAMS, Gap, Source, encode, topic_for
from support.collector_testkit import MAX_RECORD, SESSION_TIMEOUT_MS
from support.hostile import fuzz_value, hostile_values, valid_envelope

RECORDS_PER_STREAM = 1_200
"""6,000 records per run: half valid, half hostile."""
RSS_BOUND = 1024 * 1024 * 1024
"""Peak resident memory of one collector process in this test (documented bound)."""

_DUMP = r"""
import json, sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
out = {}
for table in sys.argv[2:]:
    where = "WHERE detected_by = 'publisher'" if table == "stream_gaps" else ""
    rows = client.query(
        f"SELECT _topic, _partition, _offset, count() FROM kvscope.{table} {where} "
        "GROUP BY _topic, _partition, _offset"
    ).result_rows
    out[table] = [list(r) for r in rows]
print(json.dumps(out))
"""


def _records(rng: random.Random) -> dict[str, list[tuple[bytes, bytes | None, bool]]]:
    """Per stream: (key, value, valid) in publishing order."""
    out: dict[str, list[tuple[bytes, bytes | None, bool]]] = {}
    for stream in STREAMS:
        sources = [Source(instance=f"fz-{stream}-{i}", dp_rank=i) for i in range(3)]
        seqs = dict.fromkeys(sources, 0)
        named = [
            v for _, v, _ in hostile_values(stream, valid_envelope(stream, sources[0], 9, 0, rng))
        ]
        records: list[tuple[bytes, bytes | None, bool]] = []
        for i in range(RECORDS_PER_STREAM):
            source = rng.choice(sources)
            env = valid_envelope(stream, source, 9, seqs[source], rng)
            if i % 50 == 0:
                env.body = Gap(first_seq=seqs[source] + 1, last_seq=seqs[source] + 2)
                seqs[source] += 2
            if i % 2 == 0:
                seqs[source] += 1
                records.append((source.key.encode(), encode(env), True))
            elif named and rng.random() < 0.1:
                records.append((source.key.encode(), named.pop(), False))
            else:
                records.append((source.key.encode(), fuzz_value(env, rng), False))
        out[stream] = records
    return out


async def _publish(bootstrap: str, prefix: str, records: Any) -> list[tuple[str, int, int, int]]:
    """Publish every record; (stream index, partition, offset, record index) per record."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, max_request_size=MAX_RECORD, linger_ms=5
    )
    await producer.start()
    try:
        futures = []
        for s, stream in enumerate(STREAMS):
            for i, (key, value, _) in enumerate(records[stream]):
                future = await producer.send(topic_for(stream, prefix), value=value, key=key)
                futures.append((s, i, future))
        return [(s, (m := await f).partition, m.offset, i) for s, i, f in futures]
    finally:
        await producer.stop()


def _expected_rows(stream: str, value: bytes | None) -> tuple[str, int]:
    """Where the collector's own decoder files a record and how many rows it makes there."""

    class Rec:
        offset = 0
        key = b""

    record = Rec()
    record.value = value  # type: ignore[attr-defined]
    decoded = decode_records(stream, [record])  # type: ignore[list-item]
    if decoded.bad:
        return INGEST_ERRORS.name, 1
    if decoded.gaps:
        return STREAM_GAPS.name, 1
    envelope = decoded.envelopes[0]
    rows = kv_rows(envelope.body) if isinstance(envelope, FlatKVEnvelope) else 1
    return STREAM_TABLES[stream], rows


def _consumed(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return -1.0
    found = re.findall(r"kvscope_collector_records_consumed_total\{[^}]*\} ([0-9.e+]+)", text)
    return sum(float(v) for v in found)


def _high_water_rss(pid: int, seen: int) -> int:
    """The larger of `seen` and `pid`'s own peak RSS (VmHWM) in bytes, 0 once it is gone.

    VmHWM belongs to the process's own address space, so it starts afresh at exec; the
    rusage `ru_maxrss` that `wait4` reports does not (Linux keeps the forking parent's
    high-water mark across exec, so every child of a big pytest process looked as big).
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return seen
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return max(seen, int(found.group(1)) * 1024) if found else seen


def _wait(process: subprocess.Popen, timeout_s: float, peak: int = 0) -> tuple[int, int]:
    """Reap `process`: (exit status as Popen reports it, its peak RSS in bytes).

    The peak is sampled every 0.1 s until the process exits, so at most its last 0.1 s
    goes unseen.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        peak = _high_water_rss(process.pid, peak)
        pid, status, _ = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, peak
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"collector {process.args} did not exit within {timeout_s} s")


def _collect(bootstrap: str, prefix: str, chdb: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "kvscope.cli", "--log-level", "WARNING", "collect",
        "--bootstrap-servers", bootstrap, "--clickhouse", f"chdb://{chdb}",
        "--group", f"g-{prefix}", "--topic-prefix", prefix,
        "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
        "--batch-seconds", "0.5", *extra,
    ]  # fmt: skip


def test_hostile_records_never_stop_the_collector(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    rng = random.Random(20261123)
    records = _records(rng)
    total = sum(len(r) for r in records.values())
    assert total >= 5_000
    positions = asyncio.run(_publish(bootstrap_servers, topic_prefix, records))
    chdb = tmp_path / "chdb"
    port = free_port()
    log = tmp_path / "collect-1.log"
    first = subprocess.Popen(
        _collect(bootstrap_servers, topic_prefix, chdb, "--metrics-port", str(port)),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _consumed(port) < total:
            assert first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.25)
        assert _consumed(port) == total, log.read_text()[-3000:]
        time.sleep(0.3)
        assert first.poll() is None, log.read_text()[-3000:]
        first_peak = _high_water_rss(first.pid, 0)
    finally:
        first.send_signal(signal.SIGKILL)
    _, peak = _wait(first, 30, first_peak)
    peaks = [peak]
    for run in (2, 3):
        log = tmp_path / f"collect-{run}.log"
        process = subprocess.Popen(
            _collect(bootstrap_servers, topic_prefix, chdb, "--exit-when-idle", "3"),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        code, peak = _wait(process, 180)
        peaks.append(peak)
        assert code == 0, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()

    tables = [*STREAM_TABLES.values(), INGEST_ERRORS.name, STREAM_GAPS.name]
    dump = subprocess.run(
        [sys.executable, "-c", _DUMP, str(chdb), *tables],
        capture_output=True,
        check=True,
        timeout=120,
    )
    found: dict[tuple[str, int, int], dict[str, int]] = {}
    for table, rows in json.loads(dump.stdout).items():
        for topic, partition, offset, count in rows:
            found.setdefault((topic, partition, offset), {})[table] = count
    valid = hostile = unstored = 0
    for s, partition, offset, i in positions:
        stream = STREAMS[s]
        _, value, is_valid = records[stream][i]
        where = found.pop((topic_for(stream, topic_prefix), partition, offset), {})
        table, rows = _expected_rows(stream, value)
        if is_valid:
            valid += 1
            assert where == {table: rows}, (stream, offset)
        elif rows == 0:
            unstored += 1
            assert where == {}, (stream, offset)
        else:
            hostile += 1
            assert len(where) == 1, (stream, offset, where)
            assert where == {table: rows}, (stream, offset, where)
    assert found == {}
    assert valid == total // 2 and hostile + unstored == total - valid
    print(f"peak RSS per collector run: {[p // 2**20 for p in peaks]} MiB")
    assert max(peaks) < RSS_BOUND

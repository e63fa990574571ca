"""`kvscope collect` as a process: /metrics over HTTP, and SIGTERM flushes and commits."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from kvscope.local.broker import free_port
from kvscope.schemas import Source, topic_for
from support.collector_testkit import (
    SESSION_TIMEOUT_MS,
    kv_envelopes,
    kv_row_count,
    publish_envelopes,
)

_COUNT = r"""
import json, sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
rows = client.query(
    "SELECT _partition, count(), max(_offset) FROM kvscope.kv_block_events GROUP BY _partition"
).result_rows
print(json.dumps(rows))
"""


def _metric(port: int, pattern: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(pattern + r" ([0-9.e+]+)", text)
    return float(match.group(1)) if match else None


async def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


def test_sigterm_flushes_buffered_rows_and_commits(
    bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    envelopes = kv_envelopes(Source(instance="term"), 4, 50)
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes))
    port = free_port()
    group = f"g-{topic_prefix}"
    log = tmp_path / "collector.log"
    cmd = [
        sys.executable, "-m", "kvscope.cli", "collect",
        "--bootstrap-servers", bootstrap_servers, "--clickhouse", f"chdb://{tmp_path / 'chdb'}",
        "--group", group, "--topic-prefix", topic_prefix, "--batch-seconds", "600",
        "--batch-rows", "1000000", "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
        "--metrics-port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    topic = topic_for("kv-events", topic_prefix)
    consumed = rf'kvscope_collector_records_consumed_total\{{topic="{re.escape(topic)}"\}}'
    inserted = r'kvscope_collector_rows_inserted_total\{table="kv_block_events"\}'
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and _metric(port, consumed) != 50:
            assert process.poll() is None, log.read_text()
            time.sleep(0.2)
        assert _metric(port, consumed) == 50, log.read_text()
        assert not _metric(port, inserted)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    dump = subprocess.run(
        [sys.executable, "-c", _COUNT, str(tmp_path / "chdb")],
        capture_output=True,
        check=True,
        timeout=60,
    )
    [(partition, rows, last_offset)] = json.loads(dump.stdout)
    assert (rows, last_offset) == (kv_row_count(envelopes), 49)
    committed = asyncio.run(_committed(bootstrap_servers, group, TopicPartition(topic, partition)))
    assert committed == 50

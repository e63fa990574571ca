"""Hostile records through the real broker into the real chDB: none stops the collector.

Each test reproduces a finding of issue 17: before the fix the collector raised out of
`run()` (poison pills on the KV fast path, dp_rank > 65535 on the gap path), stored
nonsense (NaN/inf timestamps, Gap ranges running backwards, seq 2^64-1, megabyte
names), built millions of rows from one record, or made one insert per record when
records alternate between days.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kvscope.collector.pipeline.plan import MAX_INSERT_ROWS, Insert
from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.tables import INGEST_BATCHES, STREAM_TABLES
from kvscope.collector.storage.target import parse_target
from kvscope.local.broker import LocalBroker
from kvscope.schemas import (
    STREAMS,
    BlockRemoved,
    Envelope,
    KVEventBatch,
    Source,
    encode,
    topic_for,
)
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD
from support.chdb_database import fresh_database
from support.collector_testkit import (
    SESSION_TIMEOUT_MS,
    SinkWrapper,
    collector_config,
    envelope,
    kv_envelopes,
    kv_row_count,
    publish,
    publish_envelopes,
)
from support.hostile import hostile_values, valid_envelope

SOURCE = Source(instance="hostile", model="m")
DAY = 86_400.0


def _rows(clickhouse: Any, sql: str) -> list[tuple]:
    return list(clickhouse.query(sql).result_rows)


def _run(config: Any, clickhouse: Any, sink: Any = None) -> None:
    collector = Collector(config, sink=sink or ClickHouseSink(ChdbStore(clickhouse)))
    asyncio.run(collector.run())


class Attacked(NamedTuple):
    """What one stream's topic received: the valid envelopes and each attack's offset."""

    attacks: list[tuple[str, bytes | None, str]]
    valid: list[Envelope]
    bad_offsets: list[int]


def _attack(stream: str, rng: random.Random) -> tuple[Attacked, list[tuple[bytes, bytes | None]]]:
    """Every named attack on `stream`, each after a valid record: what is published, and
    the records to publish."""
    template = valid_envelope(stream, SOURCE, 3, 0, rng)
    attacks = hostile_values(stream, template)
    # the gap-path crash needed the bad Gap as the partition's last record
    attacks.sort(key=lambda attack: attack[0] == "gap dp_rank 70000")
    key = SOURCE.key.encode()
    records: list[tuple[bytes, bytes | None]] = []
    valid, bad_offsets = [], []
    for seq, (_, value, _) in enumerate(attacks):
        good = valid_envelope(stream, SOURCE, 3, seq, rng)
        valid.append(good)
        records.append((key, encode(good)))
        bad_offsets.append(len(records))
        records.append((key, value))
    return Attacked(attacks, valid, bad_offsets), records


@pytest.fixture(scope="module")
def attacked(
    broker: LocalBroker, chdb_path: Path
) -> Iterator[tuple[Any, str, dict[str, Attacked]]]:
    """Every stream's topic gets every named attack; one collector of all streams runs over
    them, then once more (a restart that finds nothing new). One run for all streams: each
    collector start waits out a group join and the idle exit, and each stream's table and
    ingest errors are told apart by topic.

    Yields the client on the stored database, the topic prefix and what each stream got.
    """
    prefix = f"t{uuid.uuid4().hex[:10]}."
    database = f"test_{uuid.uuid4().hex[:12]}"
    url = f"chdb://{chdb_path}?database={database}"
    with fresh_database(chdb_path, database) as clickhouse:
        migrate(clickhouse, parse_target(url))
        rng = random.Random(17)
        published: dict[str, Attacked] = {}
        for stream in STREAMS:
            published[stream], records = _attack(stream, rng)
            asyncio.run(publish(broker.bootstrap_servers, topic_for(stream, prefix), records))
        config = collector_config(broker.bootstrap_servers, url, prefix, exit_when_idle=1.5)

        _run(config, clickhouse)
        _run(config, clickhouse)  # a restart finds nothing new and does not fail
        yield clickhouse, prefix, published


@pytest.mark.parametrize("stream", STREAMS)
def test_every_named_attack_lands_in_ingest_errors_and_restarts_work(
    stream: str, attacked: tuple[Any, str, dict[str, Attacked]]
) -> None:
    clickhouse, prefix, published = attacked
    attacks, valid, bad_offsets = published[stream]
    table = STREAM_TABLES[stream]
    expected = kv_row_count(valid) if stream == "kv-events" else len(valid)
    assert _rows(clickhouse, f"SELECT count(), uniqExact(_offset) FROM {table}") == [
        (expected, len(valid))
    ]
    assert _rows(clickhouse, "SELECT count() FROM stream_gaps") == [(0,)]
    errors = _rows(
        clickhouse,
        f"SELECT _offset, reason FROM ingest_errors WHERE _topic = '{topic_for(stream, prefix)}' "
        "ORDER BY _offset",
    )
    assert [offset for offset, _ in errors] == bad_offsets
    for (name, _, fragment), (_, reason) in zip(attacks, errors, strict=True):
        assert fragment in reason, (name, reason)
    assert _rows(clickhouse, f"SELECT max(length(instance)), min(ts) > 0 FROM {table}") == [
        (len(SOURCE.instance), True)
    ]


class RecordingSink(SinkWrapper):
    """Observes the inserts the real sink runs (row counts per table); changes nothing."""

    def __init__(self, real: ClickHouseSink) -> None:
        super().__init__(real)
        self.inserts: list[tuple[str, int]] = []

    def insert(self, insert: Insert) -> None:
        """Record, then pass on to the real sink."""
        self.real.insert(insert)
        self.inserts.append((insert.table, insert.rows.num_rows))


@pytest.mark.parametrize("batch_rows", [20_000, 1_000_000])
def test_flushes_stay_one_insert_whatever_the_records_hold(
    batch_rows: int,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    """25 records at the rows-per-record limit, of one-byte hashes (2.5M rows in 2.5 MB):
    no insert exceeds what one block holds, whatever --batch-rows says."""
    migrate(clickhouse, parse_target(clickhouse_url))
    big = BlockRemoved(block_hashes=[seq % 100 for seq in range(MAX_ROWS_PER_RECORD)])
    envelopes = [
        envelope(SOURCE, 1, seq, 1_763_700_000.0 + seq, KVEventBatch(ts=1.0, events=[big]))
        for seq in range(25)
    ] + kv_envelopes(SOURCE, 1, 200, start_seq=25)
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes))
    config = collector_config(
        bootstrap_servers, clickhouse_url, topic_prefix, batch_rows=batch_rows, batch_seconds=5.0
    )
    sink = RecordingSink(ClickHouseSink(ChdbStore(clickhouse)))
    _run(config, clickhouse, sink)

    assert _rows(clickhouse, "SELECT count() FROM kv_block_events") == [(kv_row_count(envelopes),)]
    sizes = [rows for table, rows in sink.inserts if table == "kv_block_events"]
    assert max(sizes) <= MAX_INSERT_ROWS
    assert len(sizes) >= 2


class CrashingSink(SinkWrapper):
    """Fault injector: the process "dies" (every insert raises) after the first data insert
    that follows a batch note, i.e. with the noted batch stored in part. A real crash at
    exactly that point cannot be produced on demand."""

    def __init__(self, real: ClickHouseSink) -> None:
        super().__init__(real)
        self.noted = False
        self.dead = False
        self._lock = threading.Lock()

    def insert(self, insert: Insert) -> None:
        """Pass inserts on until the trigger, then fail everything."""
        with self._lock:
            if self.dead:
                raise RuntimeError("injected crash")
            self.real.insert(insert)
            if insert.table == INGEST_BATCHES.name:
                self.noted = True
            elif self.noted:
                self.dead = True


@pytest.mark.parametrize("records", [40, 1_000])
def test_records_alternating_days_are_batched_per_day_and_survive_a_crash(
    records: int, bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    envelopes = kv_envelopes(SOURCE, 2, records)
    for i, env in enumerate(envelopes):
        env.ts += (i % 2) * DAY
    asyncio.run(publish_envelopes(bootstrap_servers, topic_prefix, "kv-events", envelopes))
    config = collector_config(bootstrap_servers, clickhouse_url, topic_prefix, batch_seconds=2.0)

    crashing = CrashingSink(ClickHouseSink(ChdbStore(clickhouse)))
    with pytest.raises(RuntimeError, match="injected crash"):
        _run(config, clickhouse, crashing)
    stored = _rows(clickhouse, "SELECT count() FROM kv_block_events")[0][0]
    assert 0 < stored < kv_row_count(envelopes)

    recording = RecordingSink(ClickHouseSink(ChdbStore(clickhouse)))
    _run(config, clickhouse, recording)

    assert _rows(
        clickhouse,
        "SELECT count(), uniqExact(_offset, event_index, position), uniqExact(toDate(ts)) "
        "FROM kv_block_events",
    ) == [(kv_row_count(envelopes), kv_row_count(envelopes), 2)]
    assert _rows(clickhouse, "SELECT count() FROM stream_gaps") == [(0,)]
    data_inserts = [t for t, _ in recording.inserts if t == "kv_block_events"]
    assert 1 <= len(data_inserts) <= 4


def test_collect_refuses_an_invalid_topic_prefix(bootstrap_servers: str, tmp_path: Any) -> None:
    for prefix in ("bad prefix.", "ü.", "x" * 240):
        done = subprocess.run(
            [
                sys.executable, "-m", "kvscope.cli", "collect",
                "--bootstrap-servers", bootstrap_servers,
                "--clickhouse", f"chdb://{tmp_path}", "--topic-prefix", prefix,
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr  # bad input: exit 2
        assert done.stderr.count("\n") == 1 and "--topic-prefix" in done.stderr
        assert "Traceback" not in done.stderr


EVIL = "pod\x1b[2J\x1b[31mred\rX\u202eevil"
"""An instance name with ANSI escapes, a CR and a bidi override."""


@pytest.fixture(scope="module")
def evil_chdb(broker: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A chDB directory a real `kvscope collect` stored records of instance `EVIL` into
    (once for the module: every output format reads the same rows)."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    envelopes = kv_envelopes(Source(instance=EVIL), 1, 3)
    asyncio.run(publish_envelopes(broker.bootstrap_servers, prefix, "kv-events", envelopes))
    chdb = f"chdb://{tmp_path_factory.mktemp('evil') / 'chdb'}"
    collect = subprocess.run(
        [
            sys.executable, "-m", "kvscope.cli", "collect",
            "--bootstrap-servers", broker.bootstrap_servers, "--clickhouse", chdb,
            "--group", f"g-{prefix}", "--topic-prefix", prefix,
            "--session-timeout-ms", str(SESSION_TIMEOUT_MS), "--exit-when-idle", "2",
        ],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stderr[-2000:]
    return chdb


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_query_output_shows_control_characters_escaped(fmt: str, evil_chdb: str) -> None:
    """`EVIL`, stored by a real `kvscope collect`, printed by `kvscope query`: nothing
    reaches the terminal raw."""
    query = subprocess.run(
        [
            sys.executable, "-m", "kvscope.cli", "query", "report_instances",
            "--clickhouse", evil_chdb, "--format", fmt,
            "--param", "since=2000-01-01 00:00:00", "--param", "until=2100-01-01 00:00:00",
            "--param", "model=",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    assert "pod\\x1b[2J\\x1b[31mred\\x0dX\\u202eevil" in query.stdout
    assert not any(c in query.stdout for c in "\x1b\r\u202e")

"""Migrations on the real ClickHouse engine (chDB): idempotent, versioned, concurrent-safe."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.decode import _flat_kv_decoder
from kvscope.collector.pipeline.plan import Insert
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import (
    MAX_TTL_DAYS,
    apply_ttl,
    load_migrations,
    migrate,
    run_migrations,
)
from kvscope.collector.storage.store import ChdbStore, ServerStore
from kvscope.collector.storage.tables import AGGREGATES, MIGRATIONS, RAW
from kvscope.collector.storage.target import connect, parse_target
from kvscope.schemas import Source, encode
from kvscope.schemas.errors import ConfigError
from kvscope.serve.access import open_existing, open_reader
from kvscope.simulator.fleet import SimConfig
from support.analytics_kit import run_direct
from support.collector_testkit import kv_envelopes

CONTRACT_TABLES = {t.name for t in (*RAW, *AGGREGATES)} | {MIGRATIONS}


def _tables(client: Any) -> set[str]:
    rows = client.query(
        "SELECT name FROM system.tables WHERE database = {db:String}",
        parameters={"db": client.database},
    ).result_rows
    return {row[0] for row in rows}


def _create_queries(client: Any) -> dict[str, str]:
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String}",
        parameters={"db": client.database},
    ).result_rows
    return dict(rows)


def test_migrations_apply_once_then_are_noops(clickhouse: Any, clickhouse_url: str) -> None:
    target = parse_target(clickhouse_url)
    versions = [m.version for m in load_migrations()]
    assert migrate(clickhouse, target) == versions
    before = _create_queries(clickhouse)
    assert set(before) >= CONTRACT_TABLES
    assert migrate(clickhouse, target) == []
    assert _create_queries(clickhouse) == before
    recorded = clickhouse.query(f"SELECT version FROM {MIGRATIONS} FINAL").result_rows
    assert sorted(r[0] for r in recorded) == versions


def test_interval_tables_decode_cheaply_and_their_stage_matches(
    clickhouse: Any, clickhouse_url: str
) -> None:
    """Migration 008: every interval query reads kv_block_intervals, so no column keeps
    ZSTD or DoubleDelta (the decode cost of a one-hour read); its stage table, which the
    derivation writes and publishes from, has the same codecs."""
    migrate(clickhouse, parse_target(clickhouse_url))
    rows = clickhouse.query(
        "SELECT table, name, compression_codec FROM system.columns WHERE database = {db:String} "
        "AND table IN ('kv_block_intervals', 'kv_block_intervals_stage')",
        parameters={"db": clickhouse.database},
    ).result_rows
    codecs = {(table, name): codec for table, name, codec in rows}
    assert not [c for c in codecs.values() if "ZSTD" in c or "DoubleDelta" in c], codecs
    main = {name: codec for (table, name), codec in codecs.items() if table == "kv_block_intervals"}
    stage = {n: c for (table, n), c in codecs.items() if table == "kv_block_intervals_stage"}
    assert main == stage
    assert main["start_ts"] == "CODEC(Delta(8), LZ4)"


def test_two_concurrent_migrations(clickhouse: Any, clickhouse_url: str) -> None:
    errors: list[BaseException] = []
    results: list[list[int]] = []

    def run() -> None:
        try:
            results.append(run_migrations(parse_target(clickhouse_url)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    versions = [m.version for m in load_migrations()]
    assert sorted(results, key=len) == [[], versions]
    assert _tables(clickhouse) >= CONTRACT_TABLES
    count = clickhouse.query(f"SELECT count() FROM {MIGRATIONS}").result_rows[0][0]
    assert count == len(versions)


def test_ttl_set_and_removed(clickhouse: Any, clickhouse_url: str) -> None:
    run_migrations(parse_target(clickhouse_url), raw_ttl_days=30, aggregate_ttl_days=400)
    queries = _create_queries(clickhouse)
    assert "TTL toDateTime(ts) + toIntervalDay(30)" in queries["kv_block_events"]
    assert "TTL minute + toIntervalDay(400)" in queries["kv_block_events_1m"]
    apply_ttl(clickhouse, RAW, 0)
    apply_ttl(clickhouse, RAW, 0)
    assert " TTL " not in _create_queries(clickhouse)["kv_block_events"]
    assert " TTL " in _create_queries(clickhouse)["kv_block_events_1m"]


def test_ttl_that_would_pass_2106_is_refused_and_the_longest_keeps_rows(
    clickhouse: Any, clickhouse_url: str
) -> None:
    """30,000 days wrapped ClickHouse's DateTime around to 1972: every row expired."""
    migrate(clickhouse, parse_target(clickhouse_url))
    run_direct(clickhouse, SimConfig(requests=10))
    stored = clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0]
    with pytest.raises(ConfigError, match="0 to 10,000"):
        apply_ttl(clickhouse, RAW, 30_000)
    apply_ttl(clickhouse, RAW, MAX_TTL_DAYS)
    clickhouse.command("ALTER TABLE kv_block_events MATERIALIZE TTL")
    clickhouse.command("OPTIMIZE TABLE kv_block_events FINAL")
    assert clickhouse.query("SELECT count() FROM kv_block_events").result_rows[0][0] == stored


def test_retried_insert_is_deduplicated_in_raw_and_aggregate(
    clickhouse: Any, clickhouse_url: str
) -> None:
    """A retry with the same insert_deduplication_token doubles neither table nor view."""
    migrate(clickhouse, parse_target(clickhouse_url))
    rows = [["i0", 0, "m", "GPU", "stored", 2**64 - 1 - n, n] for n in range(5)]
    columns = ["instance", "dp_rank", "model", "medium", "event", "block_hash", "_offset"]
    settings = {
        "insert_deduplication_token": "t-1",
        "deduplicate_blocks_in_dependent_materialized_views": 1,
    }
    for _ in range(3):
        clickhouse.insert("kv_block_events", rows, column_names=columns, settings=settings)
    clickhouse.insert(
        "kv_block_events",
        rows,
        column_names=columns,
        settings={**settings, "insert_deduplication_token": "t-2"},
    )
    raw = clickhouse.query("SELECT count(), max(block_hash) FROM kv_block_events").result_rows
    assert raw == [(10, 2**64 - 1)]
    agg = clickhouse.query("SELECT sum(stores) FROM kv_block_events_1m").result_rows
    assert agg == [(10,)]


def test_both_insert_paths_store_the_same_rows_once(clickhouse: Any, clickhouse_url: str) -> None:
    """The server path (insert_arrow) and chDB's in-place path store identical rows, and a
    retry of either with the same token is dropped in the raw table and the view."""
    migrate(clickhouse, parse_target(clickhouse_url))
    envelopes = [
        _flat_kv_decoder.decode(encode(e)) for e in kv_envelopes(Source(instance="p"), 2, 20)
    ]
    for in_place in (True, False):
        rows = columns.kv_block_events(envelopes, list(range(20)), f"t-{in_place}", 0)
        sink = ClickHouseSink(ChdbStore(clickhouse) if in_place else ServerStore(clickhouse))
        for _ in range(2):
            sink.insert(Insert("kv_block_events", rows, f"token-{in_place}"))
    per_path = clickhouse.query(
        "SELECT count(), groupBitXor(cityHash64(instance, dp_rank, epoch, seq, ts, event_index,"
        " position, event, block_hash, parent_hash, block_size, tokens, medium, group_idx))"
        " FROM kv_block_events GROUP BY _topic"
    ).result_rows
    assert len(per_path) == 2
    assert per_path[0] == per_path[1]
    assert per_path[0][0] == rows.num_rows
    assert clickhouse.query(
        "SELECT sum(stores) + sum(removals) + sum(clears) FROM kv_block_events_1m"
    ).result_rows == [(2 * rows.num_rows,)]


def test_one_insert_is_one_part(clickhouse: Any, clickhouse_url: str) -> None:
    """chDB reads `Python(table)` in ~32k-row blocks; the insert settings squash them so a
    planned insert stays one part (atomic, one dedup token) instead of one part per block."""
    migrate(clickhouse, parse_target(clickhouse_url))
    clickhouse.command("SYSTEM STOP MERGES kv_block_events")
    envelopes = [
        _flat_kv_decoder.decode(encode(e))
        for e in kv_envelopes(Source(instance="big"), 1, 2_500, t0=1_763_700_000.0)
    ]
    rows = columns.kv_block_events(envelopes, list(range(len(envelopes))), "t", 0)
    assert rows.num_rows > 70_000
    ClickHouseSink(ChdbStore(clickhouse)).insert(Insert("kv_block_events", rows, "one-part"))
    parts = clickhouse.query(
        "SELECT count(), sum(rows) FROM system.parts WHERE database = currentDatabase()"
        " AND table = 'kv_block_events' AND active"
    ).result_rows
    assert parts == [(1, rows.num_rows)]


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("records", [3, 400])
def test_block_hash_index_is_built_by_the_merge_after_an_in_place_insert(
    clickhouse: Any, clickhouse_url: str, in_place: bool, records: int
) -> None:
    """In-place (chDB) inserts leave the block_hash bloom filter to the part's merge, which
    computes it anyway; lookups by block_hash answer the same before and after the merge."""
    migrate(clickhouse, parse_target(clickhouse_url))
    clickhouse.command("SYSTEM STOP MERGES kv_block_events")
    envelopes = [
        _flat_kv_decoder.decode(encode(e))
        for e in kv_envelopes(Source(instance="bf"), 1, records, t0=1_763_700_000.0)
    ]
    rows = columns.kv_block_events(envelopes, list(range(len(envelopes))), "t", 0)
    sink = ClickHouseSink(ChdbStore(clickhouse) if in_place else ServerStore(clickhouse))
    half = rows.num_rows // 2
    sink.insert(Insert("kv_block_events", rows.slice(0, half), "first-half"))
    sink.insert(Insert("kv_block_events", rows.slice(half), "second-half"))
    wanted = [h for h in rows.column("block_hash").to_pylist()[:: max(1, half // 3)] if h][:4]
    assert wanted

    def lookup() -> list[tuple]:
        return clickhouse.query(
            "SELECT block_hash, count() FROM kv_block_events "
            "WHERE block_hash IN {hashes:Array(UInt64)} GROUP BY block_hash ORDER BY block_hash",
            parameters={"hashes": wanted},
        ).result_rows

    def index_bytes() -> list[int]:
        return [
            int(b)
            for (b,) in clickhouse.query(
                "SELECT secondary_indices_compressed_bytes FROM system.parts WHERE "
                "database = currentDatabase() AND table = 'kv_block_events' AND active"
            ).result_rows
        ]

    before = lookup()
    assert sum(n for _, n in before) >= len(wanted)
    assert len(index_bytes()) == 2
    assert all((b == 0) == in_place for b in index_bytes())
    clickhouse.command("SYSTEM START MERGES kv_block_events")
    clickhouse.command("OPTIMIZE TABLE kv_block_events FINAL")
    merged = index_bytes()
    assert len(merged) == 1 and merged[0] > 0
    assert lookup() == before


def test_readers_of_a_database_that_does_not_exist_are_told_to_migrate(
    chdb_path: Path, ch_database: str
) -> None:
    """It was ClickHouse's 'DatabaseError: Code: 81. ... UNKNOWN_DATABASE' (the client's
    database was set before the check, so the check itself failed)."""
    target = parse_target(f"chdb://{chdb_path}?database={ch_database}")
    for read in (open_reader, open_existing, lambda t: connect(t, create_database=False)):
        with pytest.raises(ConfigError, match=rf"database '{ch_database}' does not exist at "):
            read(target)

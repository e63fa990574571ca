"""The residency progress is read through its `latest` projection, whatever its history.

Every publish appends a progress row per source epoch it derived, so `kv_residency_progress`
grows with uptime; its readers (the refresh's plan and staging, `duplication`,
`routing_opportunity`, the committed generation) ask only for each source epoch's latest
values, which migration 010's aggregate projection keeps per part. These tests check, with
ClickHouse's own plans, that every statement reading the table is answered by the
projection (a filter or a DISTINCT that keeps ClickHouse from using it fails them), that
the answers equal a read of every row, and that the migration materializes the projection
for progress written before it.
"""

from __future__ import annotations

import importlib.resources
import re
from typing import Any

import pytest
from kvscope.analytics.queries import bind_params, list_queries, run_query
from kvscope.collector.storage import residency
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.tables import MIGRATIONS
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import FAR_FUTURE, simulate_direct

READS_PROGRESS = re.compile(r"\bFROM kv_residency_progress\b")
NO_PROJECTIONS = {"optimize_use_projections": 0}
SCALAR_SUBQUERY = re.compile(r"\((SELECT [^()]*\([^()]*\)[^()]* FROM kv_residency_progress)\)")


def _derive_in_many_generations(client: Any, seed: int, steps: int = 6) -> None:
    """A simulated fleet whose block events arrive in `steps` slices of time, each derived
    when it lands, so that every source has several progress rows, in several parts."""
    config = SimConfig(instances=parse_instances("3"), requests=120, seed=seed, capacity_blocks=80)
    simulate_direct(client, config)
    client.command("CREATE TABLE held ENGINE = Memory AS SELECT * FROM kv_block_events")
    client.command("TRUNCATE TABLE kv_block_events")
    lo, hi = client.query("SELECT min(ts), max(ts) FROM held").result_rows[0]
    cuts = [lo + (hi - lo) * i / steps for i in range(1, steps)] + [hi]
    previous = lo - (hi - lo)
    for cut in cuts:
        client.command(
            "INSERT INTO kv_block_events SELECT * FROM held "
            "WHERE ts > {a:DateTime64(6)} AND ts <= {b:DateTime64(6)}",
            parameters={"a": previous, "b": cut},
        )
        residency.refresh(client)
        previous = cut


def _residency_reads() -> dict[str, str]:
    """The refresh's statements that read the progress, as plain SELECTs."""
    folder = importlib.resources.files("kvscope.sql").joinpath("residency")
    out = {}
    for entry in folder.iterdir():
        name = entry.name.removesuffix(".sql")
        if name.startswith("_") or not entry.name.endswith(".sql"):
            continue
        statements = [s.replace("/* sources */", "1") for s in residency._statements(name)]
        for i, statement in enumerate(s for s in statements if READS_PROGRESS.search(s)):
            out[f"{name}[{i}]"] = re.sub(r"^INSERT INTO \w+\s*", "", statement)
    return out


def _reads_of_progress(client: Any, sql: str, params: dict) -> list[str]:
    """What each read of kv_residency_progress in `sql` reads: the table or a projection
    (the name in `ReadFromMergeTree (...)` of its plan). A scalar subquery is computed while
    planning, so its reads show in a plan of its own."""
    reads = []
    for part in [sql, *SCALAR_SUBQUERY.findall(sql)]:
        lines = client.query(f"EXPLAIN {part}", parameters=params).result_rows
        steps = [line[0].strip(" │└├─") for line in lines]
        reads += [
            s.removeprefix("ReadFromMergeTree ")
            for s in steps
            if s.startswith("ReadFromMergeTree") and re.search(r"kv_residency_progress\)|latest", s)
        ]
    return reads


def test_every_read_of_the_progress_uses_the_projection(tables: Any) -> None:
    """Each statement of the refresh and each query that reads kv_residency_progress is
    planned on the `latest` projection, never on the table's rows."""
    db = tables  # conftest's migrated test database
    _derive_in_many_generations(db, seed=5)
    residency_reads = _residency_reads()
    assert {"plan[0]", "stage_events[0]", "stage_progress[0]", "committed[0]"} <= set(
        residency_reads
    )
    checked = []
    for name, sql in residency_reads.items():
        params = {"generation": 1, "committed": 1}
        checked.append((name, _reads_of_progress(db, sql, params)))
    users = [q for q in list_queries() if READS_PROGRESS.search(q.sql)]
    assert {"duplication", "routing_opportunity", "residency"} <= {q.name for q in users}
    for q in users:
        window = {"since": "2026-01-01T00:00:00", "until": FAR_FUTURE}
        params = bind_params(q, {k: v for k, v in window.items() if k in q.params})
        checked.append((q.name, _reads_of_progress(db, q.sql, params)))
    for name, reads in checked:
        assert reads, f"{name}: no read of kv_residency_progress in its plan"
        assert set(reads) == {"(latest)"}, f"{name} reads {reads}"


@pytest.mark.parametrize("seed", [5, 8])
def test_the_projection_answers_as_every_row_does(tables: Any, seed: int) -> None:
    """The progress reads give the same rows from the projection as from every row."""
    db = tables  # conftest's migrated test database
    _derive_in_many_generations(db, seed)
    rows = db.command("SELECT count() FROM kv_residency_progress")
    epochs = db.command("SELECT uniqExact(instance, dp_rank, epoch) FROM kv_residency_progress")
    assert rows > 2 * epochs, "every source epoch should have several progress rows"
    for name, sql in _residency_reads().items():
        if name.startswith("stage_"):
            continue  # they read the stage too, emptied after each publish
        got = db.query(sql, settings={"join_use_nulls": 1}).result_rows
        full = db.query(sql, settings={"join_use_nulls": 1, **NO_PROJECTIONS}).result_rows
        assert got == full, name
    lo, hi = db.query("SELECT min(ts), max(ts) FROM kv_block_events").result_rows[0]
    q = next(q for q in list_queries() if q.name == "duplication")
    for until in (lo + (hi - lo) * f for f in (0.3, 0.6, 1.0)):
        params = bind_params(q, {"until": until})
        got = db.query(q.sql, parameters=params).result_rows
        assert got == db.query(q.sql, parameters=params, settings=NO_PROJECTIONS).result_rows
        assert got, "no resident blocks"


PROGRESS_PARTS = "database = currentDatabase() AND table = 'kv_residency_progress' AND active"


def _parts(client: Any) -> list[tuple]:
    """The active parts of kv_residency_progress."""
    sql = f"SELECT name FROM system.parts WHERE {PROGRESS_PARTS} ORDER BY name"
    return client.query(sql).result_rows


def _projected_parts(client: Any) -> list[tuple]:
    """The active parts of kv_residency_progress that have a `latest` projection part."""
    sql = (
        f"SELECT parent_name FROM system.projection_parts WHERE {PROGRESS_PARTS} "
        "AND name = 'latest' ORDER BY parent_name"
    )
    return client.query(sql).result_rows


def test_migration_010_materializes_the_projection_for_existing_progress(
    tables: Any, clickhouse_url: str
) -> None:
    """Progress written before migration 010 (no projection in its parts) gets it from the
    migration: every active part then has its `latest` projection part."""
    db = tables  # conftest's migrated test database
    db.command("ALTER TABLE kv_residency_progress DROP PROJECTION latest")
    _derive_in_many_generations(db, seed=8)
    before = run_query(db, "duplication", {"until": FAR_FUTURE})
    assert _parts(db) and _projected_parts(db) == []
    db.command(f"ALTER TABLE {MIGRATIONS} DELETE WHERE version = 10 SETTINGS mutations_sync = 1")
    assert migrate(db, parse_target(clickhouse_url)) == [10]
    assert _projected_parts(db) == _parts(db)
    assert run_query(db, "duplication", {"until": FAR_FUTURE}) == before
    assert migrate(db, parse_target(clickhouse_url)) == []

"""The window queries read only the open intervals of the epochs their window can need.

Every engine restart leaves the blocks its epoch held in kv_block_open for good (the next
epoch's first event ends them: `_epoch_restarts.sql`), up to a cache's worth per source and
restart. The queries find from the progress which epochs can have a row in their window
and select only those epochs' granules by kv_block_open's primary key (`indexHint`), so a
long restart history costs them nothing. Checked on ClickHouse's plans (`EXPLAIN indexes`)
after a fleet of two sources ran four times, each run's events derived as a collector
derives them: a window inside the last run selects at most half of kv_block_open's
granules, the full history all of them. The answers themselves are checked against the
window definition by the other tests of this folder (test_restarts.py,
test_residency_materialized.py).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from kvscope.collector.analytics.queries import bind_params, list_queries
from kvscope.collector.storage import residency

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RUN = dt.timedelta(hours=1)
RUNS = 4
BLOCKS = 20_000
"""Blocks each run of each source stores and leaves resident (~2.4 granules)."""
READS_OPEN = re.compile(r"\bFROM kv_block_open\b")
GRANULES = re.compile(r"Granules: (\d+)/(\d+)")


def _run(client: Any, run: int) -> None:
    """Run `run` of sources s0 and s1: BlockStored events of 8 hashes, none removed."""
    client.command(
        f"""INSERT INTO kv_block_events (instance, dp_rank, model, role, engine, epoch, seq,
            ts, event_index, position, event, block_hash, parent_hash, block_size, tokens,
            medium, _topic, _partition, _offset)
        SELECT 's' || toString(s), 0, 'm', 'both', 'vllm', cityHash64(s, {run}), r,
               {{ts:DateTime64(6)}} + toIntervalMillisecond(r * 100 + s), 0, p, 'stored',
               cityHash64(s, {run}, r, p), 0, 16, 16, 'GPU', 'kv', s, {run * BLOCKS} + r
        FROM (SELECT number AS s FROM numbers(2)) AS a
        CROSS JOIN (SELECT number AS r FROM numbers({BLOCKS // 8})) AS b
        CROSS JOIN (SELECT number AS p FROM numbers(8)) AS c""",
        parameters={"ts": START + run * RUN},
    )


def _open_granules(client: Any, sql: str, params: dict) -> list[tuple[int, int]]:
    """(selected, total) granules of each read of kv_block_open in `sql`'s plan."""
    plan = client.query(f"EXPLAIN indexes = 1 {sql}", parameters=params).result_rows
    lines = [row[0] for row in plan]
    out = []
    for i, line in enumerate(lines):
        if "ReadFromMergeTree" in line and "kv_block_open)" in line:
            following = (GRANULES.search(later) for later in lines[i + 1 :])
            match = next(m for m in following if m)
            out.append((int(match[1]), int(match[2])))
    return out


def test_a_window_reads_only_the_open_rows_of_the_epochs_it_can_need(tables: Any) -> None:
    db = tables  # conftest's migrated test database
    for run in range(RUNS):
        _run(db, run)
        residency.refresh(db)
    assert db.command("SELECT count() FROM kv_block_open FINAL") == RUNS * 2 * BLOCKS
    users = [q for q in list_queries() if READS_OPEN.search(q.sql)]
    assert {
        "residency",
        "routing_opportunity",
        "refaults",
        "capacity_what_if",
        "report_residency_histogram",
        "duplication",
    } <= {q.name for q in users}
    end = START + RUNS * RUN
    for q in users:
        for since, most in ((end - RUN / 2, 0.5), (START, 1.0)):
            window = {"since": since, "until": end}
            params = bind_params(q, {k: v for k, v in window.items() if k in q.params})
            reads = _open_granules(db, q.sql, params)
            assert reads, f"{q.name}: no read of kv_block_open in its plan"
            for selected, total in reads:
                full = since == START and "since" in q.params
                assert selected <= total * most, f"{q.name} from {since}: {selected}/{total}"
                assert selected == total or not full, f"{q.name}, all history: {selected}"

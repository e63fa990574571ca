"""Queries and the refresh read only the committed rows of the epochs they can need.

Every engine restart leaves the blocks its epoch held in kv_block_open for good (the next
epoch's first event ends them: `_epoch_restarts.sql`), up to a cache's worth per source and
restart, and its last removals in kv_block_evicted. The window queries find from the
progress which epochs can have a row in their window, the refresh which source epochs its
increment continues, and both select only those epochs' granules by the tables' primary key
(`indexHint`), so a long restart history costs them nothing. Checked on ClickHouse's plans
(`EXPLAIN indexes`) after a fleet of two sources ran six times (each run stores blocks and
removes half of them again), each run's events derived as a collector derives them:
- a window inside the last run selects at most half of kv_block_open's granules, the full
  history all of them;
- the refresh of more events of the last run selects at most half of the granules of
  kv_block_open and kv_block_evicted.
The answers themselves are checked against the window definition by the other tests of
this folder (test_restarts.py, test_residency_materialized.py).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from kvscope.analytics.queries import bind_params, list_queries
from kvscope.collector.storage import residency
from support.analytics_kit import KeyRead, explain_key_reads, key_reads

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RUN = dt.timedelta(hours=1)
RUNS = 6
RECORDS = 10_000
"""Records each run of each source writes: one event storing 8 hashes, and in every odd
record a second event removing the previous record's (~5 granules of open rows)."""
OPEN_PER_RUN = RECORDS // 2 * 8
READS_OPEN = re.compile(r"\bFROM kv_block_open\b")


def _run(client: Any, run: int, first: int = 0, records: int = RECORDS) -> None:
    """Records `first`.. of run `run` of sources s0 and s1 (run r is epoch r of each)."""
    client.command(
        f"""INSERT INTO kv_block_events (instance, dp_rank, model, role, engine, epoch, seq,
            ts, event_index, position, event, block_hash, parent_hash, block_size, tokens,
            medium, _topic, _partition, _offset)
        SELECT 's' || toString(s), 0, 'm', 'both', 'vllm', cityHash64(s, {run}), r,
               {{ts:DateTime64(6)}} + toIntervalMillisecond(r * 100 + s), e, p,
               if(e = 0, 'stored', 'removed'), cityHash64(s, {run}, r - e, p), 0, 16, 16, 'GPU',
               'kv', s, {run * 10 * RECORDS} + r
        FROM (SELECT number AS s FROM numbers(2)) AS a
        CROSS JOIN (SELECT number + {first} AS r FROM numbers({records})) AS b
        CROSS JOIN (SELECT number AS e FROM numbers(2)) AS c
        CROSS JOIN (SELECT number AS p FROM numbers(8)) AS d
        WHERE e = 0 OR r % 2 = 1""",
        parameters={"ts": START + run * RUN},
    )


class PlanRecorder:
    """Passes every call to the real client; before the refresh stages its candidates, it
    records the table reads of that statement's SELECT plan (the stage it reads is filled
    only then)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.reads: list[list[KeyRead]] = []

    def command(self, statement: str, *args: Any, **kwargs: Any) -> Any:
        if "INSERT INTO kv_residency_stage_candidates" in statement:
            select = re.sub(r"^.*?INSERT INTO \w+\s*", "", statement, flags=re.DOTALL)
            plan = self.client.query(f"EXPLAIN indexes = 1 {select}", *args, **kwargs)
            self.reads.append(key_reads([row[0] for row in plan.result_rows]))
        return self.client.command(statement, *args, **kwargs)

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.query(*args, **kwargs)


def test_a_window_reads_only_the_open_rows_of_the_epochs_it_can_need(tables: Any) -> None:
    db = tables  # conftest's migrated test database
    for run in range(RUNS):
        _run(db, run)
        residency.refresh(db)
    assert db.command("SELECT count() FROM kv_block_open FINAL") == RUNS * 2 * OPEN_PER_RUN
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
            reads = [r for r in explain_key_reads(db, q.sql, params) if r.table == "kv_block_open"]
            assert reads, f"{q.name}: no read of kv_block_open in its plan"
            for read in reads:
                full = since == START and "since" in q.params
                seen = f"{read.selected}/{read.total}"
                assert read.selected <= read.total * most, f"{q.name} from {since}: {seen}"
                assert read.selected == read.total or not full, f"{q.name}, all history: {seen}"


def test_a_refresh_reads_only_the_committed_rows_of_the_epochs_it_continues(tables: Any) -> None:
    db = tables  # conftest's migrated test database
    for run in range(RUNS):
        _run(db, run)
        residency.refresh(db)
    _run(db, RUNS - 1, first=RECORDS, records=RECORDS // 10)  # the last run goes on
    recorder = PlanRecorder(db)
    residency.refresh(recorder)
    (reads_of_stage,) = recorder.reads
    assert db.command("SELECT count() FROM kv_block_evicted") > 0
    for table in ("kv_block_open", "kv_block_evicted"):
        reads = [r for r in reads_of_stage if r.table == table]
        assert reads, f"no read of {table} in the refresh's plan"
        for read in reads:
            assert read.selected <= read.total / 2, f"{table}: {read.selected}/{read.total}"

"""The journal of view-feeding inserts as a pure function of a plan (no ClickHouse).

What it must hold for the repeat on assignment to be exact: every view-feeding insert of
the flush with its token, day, row count, chunk sizes and per-partition offset ranges;
one even-version row per Kafka partition the flush journals; the done marks of earlier
flushes for every other partition; nothing for plans that feed no view.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from kvscope.collector.pipeline import columns, journal
from kvscope.collector.pipeline.plan import PartitionBatch, journaled, plan_inserts

DAY = 86_400.0


def _batch(partition: int, table: str, offsets: list[int], ts: float, chunks: int = 1):
    """A partition's buffered rows of `table`, split into `chunks` record batches."""
    rows = pa.table(
        {
            "_topic": pa.array(["t.kv"] * len(offsets)),
            "_partition": pa.array([partition] * len(offsets), pa.uint32()),
            "_offset": pa.array(offsets, pa.uint64()),
            "ts": columns.seconds_to_ts([ts] * len(offsets)),
        }
    )
    size = -(-len(offsets) // chunks)
    rows = pa.Table.from_batches(rows.to_batches(max_chunksize=size))
    return PartitionBatch("t.kv", partition, {table: rows}, None, max(offsets) + 1)


def _journal_rows(plan):
    [insert] = [i for i in plan if i.table == "ingest_inserts"]
    return insert.rows.to_pylist()


@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("chunks", [1, 4])
def test_journal_describes_every_view_feeding_insert(partitions: int, chunks: int) -> None:
    batches = [
        _batch(p, "kv_block_events", list(range(10 * p, 10 * p + 7 + p)), 1.0 + p, chunks)
        for p in range(partitions)
    ]
    batches.append(_batch(99, "engine_stats", [0, 1], 1.0))
    plan = plan_inserts(batches)
    out, marks = journaled(plan, flush=1_000)
    assert out[0].table == "ingest_inserts" and out[1:] == plan
    rows = _journal_rows(out)
    assert [(r["_partition"], r["version"]) for r in rows] == [
        (p, 2_000) for p in range(partitions)
    ]
    assert marks == [("t.kv", p, 2_001) for p in range(partitions)]
    [entry] = journal.decode(rows[0]["inserts"])
    [insert] = [i for i in plan if i.table == "kv_block_events"]
    assert (entry.table, entry.token, entry.rows) == (
        "kv_block_events",
        insert.token,
        len(insert.rows),
    )
    assert entry.day == 0
    assert entry.ranges == tuple(("t.kv", p, 10 * p, 10 * p + 6 + p) for p in range(partitions))
    assert entry.chunks == tuple(b.num_rows for b in insert.rows.to_batches())
    assert sum(entry.chunks) == entry.rows
    assert all(r["inserts"] == rows[0]["inserts"] for r in rows)


def test_journal_holds_one_entry_per_day_with_its_day() -> None:
    plan = plan_inserts(
        [_batch(0, "kv_transfers", [0, 1], 5.0), _batch(1, "kv_transfers", [0], DAY + 5)]
    )
    out, _ = journaled(plan, flush=7)
    entries = journal.decode(_journal_rows(out)[0]["inserts"])
    assert [(e.table, e.day, e.ranges) for e in entries] == [
        ("kv_transfers", 0, (("t.kv", 0, 0, 1),)),
        ("kv_transfers", 1, (("t.kv", 1, 0, 0),)),
    ]


def test_done_marks_go_with_the_next_journal_insert_except_for_partitions_journaled_anew() -> None:
    plan = plan_inserts([_batch(0, "kv_block_events", [5, 6], 1.0)])
    done = [("t.kv", 0, 2_001), ("t.kv", 5, 2_001), ("other", 0, 41)]
    out, marks = journaled(plan, flush=2_000, done=done)
    rows = _journal_rows(out)
    assert [(r["_topic"], r["_partition"], r["version"], r["inserts"] == "") for r in rows] == [
        ("t.kv", 0, 4_000, False),
        ("t.kv", 5, 2_001, True),
        ("other", 0, 41, True),
    ]
    assert marks == [("t.kv", 0, 4_001)]


def test_plans_that_feed_no_view_are_journaled_only_to_write_done_marks() -> None:
    plan = plan_inserts([_batch(0, "engine_stats", [0], 1.0)])
    assert journaled(plan, flush=3) == (plan, [])
    out, marks = journaled(plan, flush=3, done=[("t.kv", 2, 9)])
    assert [r["version"] for r in _journal_rows(out)] == [9] and out[1:] == plan
    assert marks == []
    assert journaled([], 0, [("t.kv", 2, 9)])[0][0].table == "ingest_inserts"


def test_tokens_differ_between_flushes_and_repeat_within_one() -> None:
    plan = plan_inserts([_batch(0, "kv_block_events", [0], 1.0)])
    tokens = {journaled(plan, flush=f)[0][0].token for f in (1, 2, 3)}
    assert len(tokens) == 3
    assert journaled(plan, flush=1)[0][0].token == journaled(plan, flush=1)[0][0].token


@pytest.mark.parametrize("chunks", [(5,), (1, 4), (2, 2, 1), (1, 1, 1, 1, 1)])
def test_rechunked_cuts_read_back_rows_like_the_original(chunks: tuple[int, ...]) -> None:
    entry = journal.JournaledInsert("kv_block_events", "x", None, 5, (("t", 0, 0, 4),), chunks)
    back = pa.Table.from_batches(pa.table({"a": list(range(5))}).to_batches(max_chunksize=3))
    cut = journal.rechunked(entry, back)
    assert tuple(b.num_rows for b in cut.to_batches()) == chunks
    assert cut.column("a").to_pylist() == list(range(5))


def test_rows_condition_selects_ranges_and_day_and_refuses_other_tables() -> None:
    entry = journal.JournaledInsert(
        "kv_transfers", "x", 3, 4, (("t", 0, 1, 2), ("t", 4, 7, 8)), (4,)
    )
    where, params = journal.rows_condition(entry)
    assert where.count("_offset BETWEEN") == 2 and "{day:Int64}" in where
    assert params == {"t0": "t", "p0": 0, "a0": 1, "b0": 2, "t1": "t", "p1": 4, "a1": 7,
                      "b1": 8, "day": 3}  # fmt: skip
    bad = journal.JournaledInsert("requests; DROP TABLE x", "x", None, 1, (("t", 0, 0, 0),), (1,))
    with pytest.raises(ValueError, match="feeds no view"):
        journal.rows_condition(bad)
    assert journal.decode(journal.encode([entry])) == [entry]
    assert journal.decode("") == []

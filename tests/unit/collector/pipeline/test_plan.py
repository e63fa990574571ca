"""The insert plan alone (`kvscope.collector.pipeline.plan`): no client, no ClickHouse.

Shapes swept: no batch, empty tables, one row, several Kafka partitions spread over
several days, every stream's table at once. Whatever the shape, the plan stores every
buffered row exactly once, each insert stays inside one (table, day), there is one insert
per (table, day), derived gap rows go first, a batch gets a note exactly when its records
would not be stored as a prefix, and the tokens depend on the rows only.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvscope.collector.pipeline import columns
from kvscope.collector.pipeline.plan import (
    DAY_US,
    MAX_FLUSH_ROWS,
    MAX_INSERT_ROWS,
    PartitionBatch,
    journaled,
    plan_inserts,
)
from kvscope.collector.storage.tables import (
    INGEST_BATCHES,
    INGEST_ERRORS,
    INGEST_INSERTS,
    PARTITIONED_BY_DAY,
    STREAM_GAPS,
    STREAM_TABLES,
)
from kvscope.schemas.limits import MAX_ROWS_PER_RECORD

DAY = 86_400.0
TOPIC = "t.kv"
STREAM_TABLE_NAMES = sorted(set(STREAM_TABLES.values()) | {INGEST_ERRORS.name})


def _rows(partition: int, offsets: list[int], days: list[int]) -> pa.Table:
    return pa.table(
        {
            "_topic": pa.array([TOPIC] * len(offsets)),
            "_partition": pa.array([partition] * len(offsets), pa.uint32()),
            "_offset": pa.array(offsets, pa.uint64()),
            "ts": columns.seconds_to_ts([1.0 + d * DAY for d in days]),
        }
    )


def _batch(partition: int, records: list[tuple[str, int]], gaps: int = 0) -> PartitionBatch:
    """A partition's buffer: record i (offset 10 + i) goes to `records[i]` = (table, day)."""
    per_table: dict[str, tuple[list[int], list[int]]] = {}
    for i, (table, day) in enumerate(records):
        offsets, days = per_table.setdefault(table, ([], []))
        offsets.append(10 + i)
        days.append(day)
    tables = {t: _rows(partition, o, d) for t, (o, d) in per_table.items()}
    derived = _rows(partition, [10] * gaps, [0] * gaps) if gaps else None
    return PartitionBatch(TOPIC, partition, tables, derived, 10 + len(records), first_offset=10)


def _day_of(table: str, rows: pa.Table) -> set[int]:
    if table not in PARTITIONED_BY_DAY:
        return {0}
    return {int(ts) // DAY_US for ts in rows.column("ts").cast(pa.int64()).to_pylist()}


def _data(plan):
    return [i for i in plan if i.table not in (INGEST_BATCHES.name, STREAM_GAPS.name)]


def _stored(plan) -> list[tuple[str, int, int]]:
    """(table, partition, offset) of every row the data inserts hold."""
    return sorted(
        (i.table, p, o)
        for i in _data(plan)
        for p, o in zip(
            i.rows.column("_partition").to_pylist(),
            i.rows.column("_offset").to_pylist(),
            strict=True,
        )
    )


def _buffered(batches) -> list[tuple[str, int, int]]:
    return sorted(
        (table, b.partition, o)
        for b in batches
        for table, rows in b.tables.items()
        for o in rows.column("_offset").to_pylist()
    )


def _needs_note(records: list[tuple[str, int]], order: list[tuple[str, int]]) -> bool:
    """A batch needs a note when its runs do not follow the plan's insert order."""
    runs = [key for key, _ in itertools.groupby(records)]
    ranks = [order.index(run) for run in runs]
    return any(b <= a for a, b in itertools.pairwise(ranks))


def _check(batches: list[PartitionBatch], shapes: list[list[tuple[str, int]]]) -> None:
    shapes = [[(t, d if t in PARTITIONED_BY_DAY else 0) for t, d in s] for s in shapes]
    plan = plan_inserts(batches)
    data = _data(plan)
    assert _stored(plan) == _buffered(batches)
    keys = []
    for insert in data:
        [day] = _day_of(insert.table, insert.rows)
        keys.append((insert.table, day))
    assert len(keys) == len(set(keys))
    assert [i.table for i in plan].count(STREAM_GAPS.name) <= 1
    if any(b.derived_gaps is not None for b in batches):
        assert plan[0].table == STREAM_GAPS.name
    noted = {
        p for i in plan if i.table == INGEST_BATCHES.name for p in i.rows["_partition"].to_pylist()
    }
    expected = {b.partition for b, s in zip(batches, shapes, strict=True) if _needs_note(s, keys)}
    assert noted == expected
    for insert in data:
        by_partition = {}
        partitions = insert.rows["_partition"].to_pylist()
        for p, o in zip(partitions, insert.rows["_offset"].to_pylist(), strict=True):
            by_partition.setdefault(p, []).append(o)
        assert [(t, p, a, b, n) for t, p, a, b, n in insert.positions] == [
            (TOPIC, p, min(o), max(o), len(o)) for p, o in by_partition.items()
        ]
        assert insert.rows.num_rows <= MAX_INSERT_ROWS
    assert [i.token for i in plan_inserts(batches)] == [i.token for i in plan]
    assert len({i.token for i in plan}) == len(plan)


def test_flush_limit_leaves_room_for_one_more_record() -> None:
    assert MAX_FLUSH_ROWS + MAX_ROWS_PER_RECORD == MAX_INSERT_ROWS


def test_no_batch_plans_nothing() -> None:
    assert plan_inserts([]) == []
    assert journaled([], 1) == ([], [])


def test_batches_without_rows_plan_nothing() -> None:
    empty = PartitionBatch(TOPIC, 0, {INGEST_ERRORS.name: _rows(0, [], [])}, None, 5, 5)
    gaps = PartitionBatch(TOPIC, 1, {}, _rows(1, [], []), 3, 3)
    assert plan_inserts([empty, gaps]) == []


@pytest.mark.parametrize("table", STREAM_TABLE_NAMES)
def test_one_row_is_one_insert_without_a_note(table: str) -> None:
    [insert] = plan_inserts([_batch(4, [(table, 0)])])
    assert insert.table == table
    assert insert.rows.num_rows == 1
    assert insert.positions == ((TOPIC, 4, 10, 10, 1),)


def test_derived_gap_rows_go_first_in_one_insert() -> None:
    batches = [_batch(p, [("kv_block_events", 0)], gaps=2) for p in range(3)]
    plan = plan_inserts(batches)
    assert [i.table for i in plan] == [STREAM_GAPS.name, "kv_block_events"]
    assert plan[0].rows.num_rows == 6


@pytest.mark.parametrize("partitions", [1, 2, 5])
@pytest.mark.parametrize("days", [1, 2, 4])
def test_partitions_over_days_get_one_insert_per_day(partitions: int, days: int) -> None:
    shapes = [[("kv_block_events", (p + r) % days) for r in range(6)] for p in range(partitions)]
    batches = [_batch(p, s) for p, s in enumerate(shapes)]
    _check(batches, shapes)
    data = _data(plan_inserts(batches))
    assert len(data) == days


def test_every_stream_at_once() -> None:
    shapes = [[(t, 0) for t in STREAM_TABLE_NAMES], [(t, 1) for t in STREAM_TABLE_NAMES]]
    batches = [_batch(p, s) for p, s in enumerate(shapes)]
    _check(batches, shapes)
    unpartitioned = [t for t in STREAM_TABLE_NAMES if t not in PARTITIONED_BY_DAY]
    expected = 2 * len(STREAM_TABLE_NAMES) - len(unpartitioned)
    assert len(_data(plan_inserts(batches))) == expected


def test_tokens_change_with_the_rows() -> None:
    one = plan_inserts([_batch(0, [("kv_block_events", 0)] * 3)])
    two = plan_inserts([_batch(1, [("kv_block_events", 0)] * 3)])
    three = plan_inserts([_batch(0, [("kv_block_events", 0)] * 4)])
    assert len({one[0].token, two[0].token, three[0].token}) == 3


def test_journal_insert_goes_first_and_leaves_done_marks() -> None:
    batches = [_batch(p, [("kv_block_events", 0), (INGEST_ERRORS.name, 0)]) for p in range(3)]
    plan = plan_inserts(batches)
    out, marks = journaled(plan, flush=5, done=[(TOPIC, 7, 3)])
    assert out[0].table == INGEST_INSERTS.name and out[1:] == plan
    assert marks == [(TOPIC, p, 11) for p in range(3)]
    rows = out[0].rows.to_pylist()
    assert sorted((r["_partition"], r["version"]) for r in rows) == [
        (0, 10),
        (1, 10),
        (2, 10),
        (7, 3),
    ]


def test_a_plan_without_view_inserts_is_not_journaled() -> None:
    plan = plan_inserts([_batch(0, [(INGEST_ERRORS.name, 0)])])
    assert journaled(plan, flush=5) == (plan, [])


_record = st.tuples(st.sampled_from(STREAM_TABLE_NAMES), st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_record, min_size=1, max_size=12), min_size=1, max_size=6))
def test_any_shape_stores_each_row_once_in_one_insert_per_table_day(
    shapes: list[list[tuple[str, int]]],
) -> None:
    _check([_batch(p, s) for p, s in enumerate(shapes)], shapes)

"""Ties are decided by the data, not by row arrival order: `routing_opportunity`, `duplication`.

Hand-made block events for one hash on four sources, three of them storing it at the same
instant: A stores and removes it at once (a zero-length interval), C holds it until t=20,
B keeps it, D stores it at t=20 (C's removal at that instant comes first). By the
documented rule (intervals that start together are taken shortest first; an end at a
start's instant comes first) B and D are opportunities, A and C are not. The same events
are inserted once per order of the three tied sources, each order under its own model,
and every order must give exactly that answer. `duplication` likewise: of two epochs of one
source that begin at the same instant, the higher is the source's latest.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from kvscope.collector.analytics.queries import run_query
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target

HASH = 0xABCDEF
T0_US = 1_700_000_000_000_000
EVENTS = {  # source -> [(seconds after T0, event)]
    "a": [(10, "stored"), (10, "removed")],
    "b": [(10, "stored")],
    "c": [(10, "stored"), (20, "removed")],
    "d": [(20, "stored")],
}
EXPECTED = {"a": 0, "b": 1, "c": 0, "d": 1}


@pytest.fixture
def db(clickhouse: Any, clickhouse_url: str) -> Any:
    """The test database with kvscope's migrations applied."""
    migrate(clickhouse, parse_target(clickhouse_url))
    return clickhouse


def _insert_rows(client: Any, rows: list[str]) -> None:
    """Insert `kv_block_events` rows given as SQL tuples of the columns below, in one insert."""
    client.command(
        "INSERT INTO kv_block_events (instance, dp_rank, model, role, engine, epoch, seq, ts, "
        "event_index, position, event, block_hash, parent_hash, block_size, tokens, medium, "
        f"_topic, _partition, _offset) VALUES {', '.join(rows)}"
    )


def _insert(client: Any, model: str, source: str, offset: int) -> int:
    """Insert `source`'s events (as instance `model/source`) in one insert; next offset."""
    rows = []
    for seq, (seconds, event) in enumerate(EVENTS[source]):
        ts = (T0_US + seconds * 1_000_000) / 1e6
        rows.append(
            f"('{model}/{source}', 0, '{model}', 'both', 'vllm', 1, {seq}, "
            f"toDateTime64({ts}, 6, 'UTC'), 0, 0, '{event}', {HASH}, 0, 16, "
            f"{16 if event == 'stored' else 0}, 'GPU', 't', 0, {offset + seq})"
        )
    _insert_rows(client, rows)
    return offset + len(rows)


def test_tied_stores_give_one_answer_in_every_arrival_order(db: Any) -> None:
    offset = 0
    orders = list(itertools.permutations("abc"))
    for n, order in enumerate(orders):
        for source in (*order, "d"):
            offset = _insert(db, f"m{n}", source, offset)
    for n, order in enumerate(orders):
        rows = run_query(db, "routing_opportunity", {"model": f"m{n}"})
        got = {r["instance"].split("/")[1]: r["opportunity_blocks"] for r in rows}
        assert got == EXPECTED, order


def _insert_epoch(client: Any, instance: str, epoch: int, hashes: list[int], offset: int) -> None:
    """One record of `instance` (model m) storing `hashes` at T0 + 10 s in `epoch`."""
    ts = (T0_US + 10_000_000) / 1e6
    rows = [
        f"('{instance}', 0, 'm', 'both', 'vllm', {epoch}, 0, toDateTime64({ts}, 6, 'UTC'), 0, "
        f"{position}, 'stored', {block_hash}, 0, 16, 16, 'GPU', 't', 0, {offset})"
        for position, block_hash in enumerate(hashes)
    ]
    _insert_rows(client, rows)


@pytest.mark.parametrize("epochs", [(1, 2), (2, 1), (7, 5), (5, 7)])
def test_epochs_that_begin_together_resolve_to_the_later_epoch(
    db: Any, epochs: tuple[int, int]
) -> None:
    """Two epochs of one source whose first events share an instant (only a clock that
    steps back makes that): `duplication` takes the higher epoch as the source's latest,
    whichever epoch is numbered or inserted first. y holds H and G; x's lower epoch holds
    H, its higher one both: both hashes are duplicated (only H if the lower epoch won)."""
    first, second = epochs
    hashes = {min(epochs): [HASH], max(epochs): [HASH, HASH + 1]}
    _insert_epoch(db, "x", first, hashes[first], 0)
    _insert_epoch(db, "x", second, hashes[second], 1)
    _insert_epoch(db, "y", 1, [HASH, HASH + 1], 2)
    until = dt.datetime.fromtimestamp((T0_US + 11_000_000) / 1e6, dt.UTC)
    (row,) = run_query(db, "duplication", {"until": until})
    assert (row["resident_hashes"], row["duplicated_hashes"]) == (2, 2)

"""`routing_opportunity` is decided by the data, not by the order rows arrive in.

Hand-made block events for one hash on four sources, three of them storing it at the same
instant: A stores and removes it at once (a zero-length interval), C holds it until t=20,
B keeps it, D stores it at t=20 (C's removal at that instant comes first). By the
documented rule (intervals that start together are taken shortest first; an end at a
start's instant comes first) B and D are opportunities, A and C are not. The same events
are inserted once per order of the three tied sources, each order under its own model,
and every order must give exactly that answer.
"""

from __future__ import annotations

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
    client.command(
        "INSERT INTO kv_block_events (instance, dp_rank, model, role, engine, epoch, seq, ts, "
        "event_index, position, event, block_hash, parent_hash, block_size, tokens, medium, "
        f"_topic, _partition, _offset) VALUES {', '.join(rows)}"
    )
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

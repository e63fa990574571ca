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

import itertools
from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from support.analytics_kit import hand_made_ts, insert_block_events

HASH = 0xABCDEF
EVENTS = {  # source -> [(seconds after T0, event)]
    "a": [(10, "stored"), (10, "removed")],
    "b": [(10, "stored")],
    "c": [(10, "stored"), (20, "removed")],
    "d": [(20, "stored")],
}
EXPECTED = {"a": 0, "b": 1, "c": 0, "d": 1}


def _insert(client: Any, model: str, source: str, offset: int) -> int:
    """Insert `source`'s events (as instance `model/source`) in one insert; next offset."""
    rows = [
        {
            "instance": f"{model}/{source}",
            "model": model,
            "seq": seq,
            "event": event,
            "ts": hand_made_ts(seconds),
            "block_hash": HASH,
            "_offset": offset + seq,
        }
        for seq, (seconds, event) in enumerate(EVENTS[source])
    ]
    insert_block_events(client, rows)
    return offset + len(rows)


def test_tied_stores_give_one_answer_in_every_arrival_order(tables: Any) -> None:
    offset = 0
    orders = list(itertools.permutations("abc"))
    for n, order in enumerate(orders):
        for source in (*order, "d"):
            offset = _insert(tables, f"m{n}", source, offset)
    for n, order in enumerate(orders):
        rows = run_query(tables, "routing_opportunity", {"model": f"m{n}"})
        got = {r["instance"].split("/")[1]: r["opportunity_blocks"] for r in rows}
        assert got == EXPECTED, order


def _insert_epoch(client: Any, instance: str, epoch: int, hashes: list[int], offset: int) -> None:
    """One record of `instance` (model m) storing `hashes` at T0 + 10 s in `epoch`."""
    rows = [
        {
            "instance": instance,
            "epoch": epoch,
            "ts": hand_made_ts(10),
            "position": position,
            "block_hash": block_hash,
            "_offset": offset,
        }
        for position, block_hash in enumerate(hashes)
    ]
    insert_block_events(client, rows)


@pytest.mark.parametrize("epochs", [(1, 2), (2, 1), (7, 5), (5, 7)])
def test_epochs_that_begin_together_resolve_to_the_later_epoch(
    tables: Any, epochs: tuple[int, int]
) -> None:
    """Two epochs of one source whose first events share an instant (only a clock that
    steps back makes that): `duplication` takes the higher epoch as the source's latest,
    whichever epoch is numbered or inserted first. y holds H and G; x's lower epoch holds
    H, its higher one both: both hashes are duplicated (only H if the lower epoch won)."""
    first, second = epochs
    hashes = {min(epochs): [HASH], max(epochs): [HASH, HASH + 1]}
    _insert_epoch(tables, "x", first, hashes[first], 0)
    _insert_epoch(tables, "x", second, hashes[second], 1)
    _insert_epoch(tables, "y", 1, [HASH, HASH + 1], 2)
    (row,) = run_query(tables, "duplication", {"until": hand_made_ts(11)})
    assert (row["resident_hashes"], row["duplicated_hashes"]) == (2, 2)

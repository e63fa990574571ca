"""A restart ends what its epoch held: `residency`, `routing_opportunity`, the report histogram.

No event says that an engine's cache emptied when it restarted; the next epoch of the same
instance and dp_rank is the only sign. Hand-made block events, one hash per block:

- x, epoch A: stores H and G at t=10, K at t=15; nothing ends them;
- x, epoch B (x restarted): stores G at t=40, its first block event;
- y: stores H at t=20 (x still holds H: an opportunity), G at t=45 (x holds G again since
  t=40: an opportunity) and K at t=50 (x's K ended with epoch A at t=40: none).

x's store of G at t=40 is no opportunity either: epoch A's G ended at that instant, and an
end at a start's instant comes first. Before restarts ended epochs, A's blocks stayed
resident forever: x counted four blocks still resident and two opportunities more.
Swept over which epoch number is the later one, the order the epochs are inserted in,
and a third epoch C (x restarted again at t=55, storing J) that must end B's G without
touching A's intervals, whose end stays B's first event. Also: a block stored by an epoch
after its successor began, and a restart under another model.
"""

from __future__ import annotations

from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from support.analytics_kit import hand_made_ts, insert_block_events

H, G, K, J = 0xA1, 0xB2, 0xC3, 0xD4


def _epoch_rows(instance: str, epoch: int, stores: list[tuple[int, int]], offset: int) -> list:
    """Rows of one epoch storing (seconds after T0, hash) pairs, one record each."""
    return [
        {
            "instance": instance,
            "epoch": epoch,
            "seq": seq,
            "ts": hand_made_ts(seconds),
            "block_hash": block_hash,
            "_offset": offset + seq,
        }
        for seq, (seconds, block_hash) in enumerate(stores)
    ]


def _load(db: Any, epochs: tuple[int, int, int], a_first: bool, third: bool) -> None:
    a, b, c = epochs
    x_a = _epoch_rows("x", a, [(10, H), (10, G), (15, K)], 0)
    x_b = _epoch_rows("x", b, [(40, G)], 10)
    for rows in (x_a, x_b) if a_first else (x_b, x_a):
        insert_block_events(db, rows)
    insert_block_events(db, _epoch_rows("y", 1, [(20, H), (45, G), (50, K)], 20))
    if third:
        insert_block_events(db, _epoch_rows("x", c, [(55, J)], 30))


def _residency(db: Any, since: float, until: float) -> dict[str, tuple]:
    rows = run_query(db, "residency", {"since": hand_made_ts(since), "until": hand_made_ts(until)})
    return {
        r["instance"]: (r["intervals"], r["still_resident"], r["ended_by_restart"], r["closed"])
        for r in rows
    }


def _opportunities(db: Any, since: float, until: float) -> dict[str, tuple]:
    rows = run_query(
        db, "routing_opportunity", {"since": hand_made_ts(since), "until": hand_made_ts(until)}
    )
    return {r["instance"]: (r["stores"], r["opportunity_blocks"]) for r in rows}


@pytest.mark.parametrize("epochs", [(1, 2, 3), (9, 4, 2), (5, 6, 1)])
@pytest.mark.parametrize("a_first", [True, False])
@pytest.mark.parametrize("third", [False, True])
def test_a_restart_ends_the_blocks_its_epoch_held(
    tables: Any, epochs: tuple[int, int, int], a_first: bool, third: bool
) -> None:
    _load(tables, epochs, a_first, third)
    b_still = 0 if third else 1  # C's first event ends B's G at t=55
    # x: A's three blocks ended by the restart; B's G; C's J.
    x_end = (4 + third, b_still + third, 3 + (1 - b_still), 3 + (1 - b_still))
    assert _residency(tables, 0, 60) == {"x": x_end, "y": (3, 3, 0, 0)}
    assert _opportunities(tables, 0, 60) == {"x": (4 + third, 0), "y": (3, 2)}
    # Before the restart, epoch A's blocks are resident and nothing has ended.
    assert _residency(tables, 0, 30) == {"x": (3, 3, 0, 0), "y": (1, 1, 0, 0)}
    assert _opportunities(tables, 0, 30) == {"x": (3, 0), "y": (1, 1)}
    # A window that starts after the restart holds none of A's blocks, and it still sees
    # that B's G was resident from before it (carried in) when y stores G at t=45.
    assert _residency(tables, 41, 60) == {
        "x": (1 + third, b_still + third, 1 - b_still, 1 - b_still),
        "y": (3, 3, 0, 0),  # H carried in
    }
    assert _opportunities(tables, 41, 60) == {"x": (third, 0), "y": (2, 1)}
    # A window that ends at the restart's instant: A's blocks are still resident at `until`.
    assert _residency(tables, 0, 40)["x"] == (3, 3, 0, 0)


def test_a_restart_does_not_end_a_block_its_epoch_stored_afterwards(tables: Any) -> None:
    """An epoch that keeps storing after a later epoch of its instance began (an engine
    that kept running under a reused name, or a clock that stepped back): such a block
    ends at its own store, so it is never counted resident after the restart."""
    insert_block_events(tables, _epoch_rows("x", 1, [(10, H), (50, G)], 0))
    insert_block_events(tables, _epoch_rows("x", 2, [(40, K)], 10))
    window = {"since": hand_made_ts(0), "until": hand_made_ts(60)}
    (x,) = run_query(tables, "residency", window)
    assert (x["intervals"], x["still_resident"], x["ended_by_restart"]) == (3, 1, 2)
    # The report's histogram holds closed and still-resident blocks, not those a restart ended.
    histogram = run_query(tables, "report_residency_histogram", window)
    assert [(r["lo_s"], r["blocks"]) for r in histogram] == [(None, 1)]
    # A window that starts after the restart still holds that store (epoch 1 has an event
    # since then): the epochs a window reads are those not ended before it or with an event
    # in it, not only those a restart has not ended.
    later = {"since": hand_made_ts(45), "until": hand_made_ts(60)}
    (x,) = run_query(tables, "residency", later)
    assert (x["intervals"], x["still_resident"], x["ended_by_restart"]) == (2, 1, 1)
    (x,) = run_query(tables, "routing_opportunity", later)
    assert x["stores"] == 1
    (x,) = run_query(tables, "refaults", later)
    assert x["stores"] == 1


def test_a_restart_under_another_model_ends_the_old_models_blocks(tables: Any) -> None:
    """The engine came back serving another model: its old blocks are gone all the same,
    also for a query that asks for the old model only (the restart is found among every
    model's epochs)."""
    insert_block_events(tables, _epoch_rows("x", 1, [(10, H), (10, G)], 0))
    restarted = [{**row, "model": "n"} for row in _epoch_rows("x", 2, [(40, K)], 10)]
    insert_block_events(tables, restarted)
    window = {"since": hand_made_ts(0), "until": hand_made_ts(60), "model": "m"}
    (x,) = run_query(tables, "residency", window)
    assert (x["intervals"], x["still_resident"], x["ended_by_restart"]) == (2, 0, 2)
    window["model"] = "n"
    (x,) = run_query(tables, "residency", window)
    assert (x["intervals"], x["still_resident"], x["ended_by_restart"]) == (1, 1, 0)

"""Passive outlier ejection and stall detection of `engines.Fleet`, on a clock the test
moves (the rules are time arithmetic; the HTTP side is in tests/integration/route)."""

from __future__ import annotations

from typing import Any

import pytest
from kvscope.route.config import EngineSpec, RouteConfig
from kvscope.route.engines import Fleet
from kvscope.route.select import choose


class Clock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet_of(count: int, clock: Clock, **settings: Any) -> Fleet:
    specs = tuple(EngineSpec(f"e{i}", f"http://127.0.0.1:{9000 + i}") for i in range(count))
    return Fleet(RouteConfig(engines=specs, **settings), clock=clock)


@pytest.mark.parametrize("after", [1, 3, 5])
def test_ejections_grow_with_each_one_up_to_the_max(after: int) -> None:
    clock = Clock()
    fleet = fleet_of(2, clock, eject_after=after, eject_base_s=10.0, eject_max_s=25.0)
    lengths = []
    for _ in range(4):
        for _ in range(after - 1):
            fleet.failed("e0", "status")
            assert fleet.is_up("e0")
        fleet.failed("e0", "status")
        assert not fleet.is_up("e0")
        start = clock.now
        while not fleet.is_up("e0"):
            clock.now += 1.0
        lengths.append(clock.now - start)
    assert lengths == [10.0, 20.0, 25.0, 25.0]


def test_a_success_restarts_the_count_and_health_leaves_an_ejection() -> None:
    clock = Clock()
    fleet = fleet_of(2, clock, eject_after=3)
    for _ in range(5):
        fleet.failed("e0", "status")
        fleet.failed("e0", "status")
        fleet.succeeded("e0")
    assert fleet.is_up("e0")
    for _ in range(3):
        fleet.failed("e0", "status")
    fleet.mark_up("e0")  # its /health answers, its requests fail
    assert not fleet.is_up("e0") and fleet.describe("e0") == "ejected"


@pytest.mark.parametrize(("count", "share", "most"), [(1, 0.1, 1), (4, 0.5, 2), (10, 0.3, 3)])
def test_at_most_a_share_of_the_fleet_is_ejected(count: int, share: float, most: int) -> None:
    fleet = fleet_of(count, Clock(), eject_after=1, max_ejected_share=share)
    for name in fleet.engines:
        fleet.failed(name, "connect")
    assert count - len(fleet.up_names()) == most


def test_a_stalled_engine_weighs_more_and_loses_its_affinity() -> None:
    clock = Clock()
    fleet = fleet_of(2, clock, stall_s=2.0, eject_after=5)
    fleet.mark_up("e1")
    stuck = [fleet.sent("e0", streamed=True) for _ in range(2)]
    clock.now += 1.0
    assert fleet.load("e0") == 2
    fleet.mark_up("e1")  # e1 answers its health check meanwhile
    clock.now += 3.5
    assert fleet.load("e0") == 2 + 2 * 2  # each request waited two stall periods
    fleet.mark_up("e1")
    candidates = fleet.candidates(None)
    assert [c.stalled for c in candidates] == [True, False]
    held = [c.__class__(**{**c.__dict__, "matched_tokens": 100 if c.name == "e0" else 0})
            for c in candidates]  # fmt: skip
    assert choose(held, prompt_tokens=100, affinity=1.0).name == "e1"
    assert fleet.engines["e0"].failures == 2  # each stuck request counted once
    fleet.candidates(None)
    assert fleet.engines["e0"].failures == 2
    for ticket in stuck:
        fleet.answered("e0", ticket)
        fleet.finished("e0", ticket)
    assert fleet.load("e0") == 0 and fleet.describe("e0") == "up"

"""How a residency refresh cuts its work into steps (whole sources within a record budget)."""

from __future__ import annotations

import pytest
from kvscope.collector.storage.residency import _pick, _sources_condition


@pytest.mark.parametrize("budget", [1, 5, 10, 25, 1000])
def test_pick_takes_whole_sources_within_the_budget(budget: int) -> None:
    plan = [("a", 0, 1, None, 9), ("b", 0, 1, 10, 20), ("c", 1, 2, 3, 4)]
    picked = _pick(plan, budget)
    assert picked == plan[: len(picked)] and picked
    records = [p[4] - (p[3] or 0) for p in picked]
    assert len(picked) == 1 or sum(records) <= budget
    if len(picked) < len(plan):
        assert sum(records) + plan[len(picked)][4] - (plan[len(picked)][3] or 0) > budget


def test_sources_condition_binds_every_value() -> None:
    text, params = _sources_condition([("x'; DROP", 3, 7, None, 9), ("y", 0, 1, 5, 8)])
    assert "DROP" not in text
    assert params == {"i0": "x'; DROP", "d0": 3, "e0": 7, "i1": "y", "d1": 0, "e1": 1, "s1": 5}
    assert text.count(" OR ") == 1 and "{s1:UInt64}" in text and "{s0:" not in text

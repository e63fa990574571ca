"""PauseReasons: a partition resumes only when its last reason is lifted."""

from __future__ import annotations

import pytest
from kvscope.collector.pipeline.pause import POSITIONING, SINK_FAILING, PauseReasons


@pytest.mark.parametrize("partitions", [1, 3, 8])
def test_resume_only_when_no_reason_left(partitions: int) -> None:
    book = PauseReasons()
    tps = [("t", p) for p in range(partitions)]
    assert book.add(tps, POSITIONING) == tps
    assert book.add(tps[:1], SINK_FAILING) == []
    assert book.remove(tps, POSITIONING) == tps[1:]
    assert book.paused() == set(tps[:1])
    assert book.why(tps[0]) == {SINK_FAILING}
    assert book.remove(tps, SINK_FAILING) == tps[:1]
    assert book.paused() == set()


def test_lifting_a_reason_never_given_changes_nothing() -> None:
    book = PauseReasons()
    book.add([("t", 0)], SINK_FAILING)
    assert book.remove([("t", 0), ("t", 1)], POSITIONING) == []
    assert book.why(("t", 0)) == {SINK_FAILING}
    assert book.why(("t", 1)) == frozenset()


def test_forget_drops_revoked_partitions_only() -> None:
    book = PauseReasons()
    book.add([("t", 0), ("t", 1)], SINK_FAILING)
    book.forget([("t", 0)])
    assert book.paused() == {("t", 1)}

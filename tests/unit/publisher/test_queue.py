"""The record queue and its loss ledger: bounded drops, merged loss ranges, take (no broker)."""

from __future__ import annotations

import itertools

import pytest
from kvscope.publisher.queue import MAX_RANGES_PER_STREAM, Item, LossLedger, RecordQueue
from prometheus_client import CollectorRegistry, Counter


class _Owner:
    """Stands in for a `SourcePublisher` as the owner of queued items (only identity matters)."""

    def take_seq(self, stream: str) -> int:
        raise AssertionError("the queue never reserves seqs")


def _queue(capacity: int) -> tuple[RecordQueue, CollectorRegistry]:
    registry = CollectorRegistry()
    dropped = Counter("dropped", "test drops", ("stream", "reason"), registry=registry)
    return RecordQueue(capacity, dropped), registry


def _dropped(registry: CollectorRegistry, stream: str, reason: str) -> float:
    value = registry.get_sample_value("dropped_total", {"stream": stream, "reason": reason})
    return value or 0.0


def _item(owner: object, seq: int, enqueued: float = 0.0, stream: str = "kv-events") -> Item:
    return Item(owner, stream, seq, 0.0, f"body-{seq}", None, enqueued)  # type: ignore[arg-type]


def test_ledger_merges_adjacent_losses_of_one_stream_and_reason() -> None:
    ledger = LossLedger()
    for seq in range(10, 20):
        ledger.add("a", "kv-events", seq, seq, "queue_full")
    ledger.add("a", "kv-events", 20, 25, "broker_unavailable")
    ledger.add("a", "requests", 26, 26, "queue_full")
    ledger.add("b", "kv-events", 21, 21, "queue_full")
    ranges = [(r.owner, r.stream, r.first, r.last, r.reason) for r in ledger.take()]
    assert ranges == [
        ("a", "kv-events", 10, 19, "queue_full"),
        ("a", "kv-events", 20, 25, "broker_unavailable"),
        ("a", "requests", 26, 26, "queue_full"),
        ("b", "kv-events", 21, 21, "queue_full"),
    ]
    assert len(ledger) == 0
    assert ledger.take() == []


def test_ledger_does_not_merge_across_a_hole() -> None:
    ledger = LossLedger()
    ledger.add("a", "kv-events", 1, 1, "queue_full")
    ledger.add("a", "kv-events", 3, 3, "queue_full")
    assert [(r.first, r.last) for r in ledger.take()] == [(1, 1), (3, 3)]


@pytest.mark.parametrize("order", list(itertools.permutations([(3, 4), (5, 9), (10, 10)])))
def test_ledger_merges_adjacent_losses_booked_in_any_order(
    order: tuple[tuple[int, int], ...],
) -> None:
    # The sender's case: a Gap naming 3..4 was refused after 5..9 were booked, and its own
    # seq 10 with it; the outage is still one range.
    ledger = LossLedger()
    for first, last in order:
        ledger.add("a", "kv-events", first, last, "send_failed")
    ledger.add("a", "kv-events", 11, 11, "queue_full")
    ledger.add("a", "kv-events", 1, 1, "send_failed")
    expected = [(1, 1, "send_failed"), (3, 10, "send_failed"), (11, 11, "queue_full")]
    assert sorted((r.first, r.last, r.reason) for r in ledger.pending()) == expected
    assert len(ledger) == 3, "pending() leaves the ranges in place"
    assert sorted((r.first, r.last, r.reason) for r in ledger.take()) == expected
    assert len(ledger) == 0


@pytest.mark.parametrize("capacity", [1, 3, 64])
def test_put_refuses_past_capacity_and_pop_keeps_order(capacity: int) -> None:
    queue, _ = _queue(capacity)
    owner = _Owner()
    accepted = [queue.put(_item(owner, seq)) for seq in range(capacity + 5)]
    assert accepted == [True] * capacity + [False] * 5
    assert len(queue) == capacity
    assert [queue.pop().seq for _ in range(capacity)] == list(range(capacity))
    assert len(queue) == 0
    with pytest.raises(IndexError):
        queue.pop()
    assert queue.put(_item(owner, 99))


@pytest.mark.parametrize("drops", [1, 7, 500])
def test_lost_counts_each_seq_and_merges_into_one_range(drops: int) -> None:
    queue, registry = _queue(1)
    owner = _Owner()
    for seq in range(drops):
        queue.lost(owner, "kv-events", seq, seq, "queue_full")
    queue.lost(owner, "requests", 0, 4, "closed")
    assert _dropped(registry, "kv-events", "queue_full") == drops
    assert _dropped(registry, "requests", "closed") == 5
    assert len(queue.losses) == 2
    ranges = [(r.owner, r.stream, r.first, r.last, r.reason) for r in queue.losses.take()]
    assert ranges == [
        (owner, "kv-events", 0, drops - 1, "queue_full"),
        (owner, "requests", 0, 4, "closed"),
    ]
    assert queue.losses.take() == []


def test_expire_reports_only_items_older_than_the_limit() -> None:
    queue, registry = _queue(10)
    owner = _Owner()
    for seq, enqueued in enumerate([1.0, 2.0, 3.0, 4.0]):
        queue.put(_item(owner, seq, enqueued))
    queue.expire(3.0, "broker_unavailable")
    assert len(queue) == 2
    assert queue.pop().seq == 2
    assert _dropped(registry, "kv-events", "broker_unavailable") == 2
    assert [(r.first, r.last) for r in queue.losses.take()] == [(0, 1)]


def test_clear_forgets_items_without_reporting_them() -> None:
    queue, registry = _queue(10)
    owner = _Owner()
    for seq in range(4):
        queue.put(_item(owner, seq))
    assert queue.clear() == 4
    assert len(queue) == 0
    assert len(queue.losses) == 0
    assert _dropped(registry, "kv-events", "shutdown") == 0


def _covered(ranges: list) -> set[int]:
    return {seq for r in ranges for seq in range(r.first, r.last + 1)}


@pytest.mark.parametrize("cycles", [MAX_RANGES_PER_STREAM - 1, MAX_RANGES_PER_STREAM + 1, 500])
def test_ledger_stays_bounded_over_reconnect_cycles_and_stays_exact(cycles: int) -> None:
    # Each outage cycle: queued records expire (broker_unavailable), then the Gap probe's
    # own seq fails (send_failed): two adjacent ranges of different reasons per cycle.
    ledger = LossLedger()
    seq = 0
    for _ in range(cycles):
        ledger.add("a", "kv-events", seq, seq + 9, "broker_unavailable")
        ledger.add("a", "kv-events", seq + 10, seq + 10, "send_failed")
        seq += 11
        assert len(ledger) <= MAX_RANGES_PER_STREAM
    ranges = ledger.take()
    assert _covered(ranges) == set(range(seq)), "exactly the lost seqs, nothing more"
    assert sum(r.last - r.first + 1 for r in ranges) == seq, "no seq named twice"
    reasons = {"broker_unavailable", "send_failed", "broker_unavailable+send_failed"}
    assert {r.reason for r in ranges} <= reasons
    if cycles > MAX_RANGES_PER_STREAM:
        assert "broker_unavailable+send_failed" in {r.reason for r in ranges}


@pytest.mark.parametrize("holes", [MAX_RANGES_PER_STREAM + 1, 3 * MAX_RANGES_PER_STREAM, 1000])
def test_ledger_bound_holds_for_losses_with_delivered_records_between(holes: int) -> None:
    ledger = LossLedger()
    for i in range(holes):
        ledger.add("a", "requests", 10 * i, 10 * i + 4, "queue_full")
        ledger.add("b", "requests", i, i, "queue_full")  # another source: merged as usual
        assert len(ledger) <= MAX_RANGES_PER_STREAM + 1
    ranges = ledger.take()
    mine = [r for r in ranges if r.owner == "a"]
    lost = {s for i in range(holes) for s in range(10 * i, 10 * i + 5)}
    assert lost <= _covered(mine), "every lost seq is still named"
    assert len(mine) <= MAX_RANGES_PER_STREAM
    assert [(r.first, r.last) for r in ranges if r.owner == "b"] == [(0, holes - 1)]


def test_put_wakes_the_sender_only_when_armed_or_at_a_full_batch() -> None:
    queue, _ = _queue(40)
    wakes: list[int] = []
    queue.waker = lambda: wakes.append(len(queue))
    owner = _Owner()
    for seq in range(3):
        assert queue.put(_item(owner, seq))
    assert wakes == [], "a busy sender is not woken per record"
    queue.armed = True
    queue.put(_item(owner, 3))
    queue.put(_item(owner, 4))
    assert wakes == [4] and not queue.armed, "the first record after idle wakes it, once"
    for seq in range(5, 12):
        queue.put(_item(owner, seq))
    assert wakes == [4, queue.full_at] == [4, 10], "a full batch (a quarter of the queue)"

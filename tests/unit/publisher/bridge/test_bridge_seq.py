"""SeqRepair: every engine seq forwarded once in order or reported lost once, exactly."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from kvscope.publisher.bridge.frames import Frame
from kvscope.publisher.bridge.seq import SeqRepair


class RecordingLink:
    """Records what SeqRepair decided (a recording sink standing in for the Kafka side)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def forward(self, frame: Frame) -> None:
        self.log.append(("fwd", frame.seq))

    def lost(self, first_seq: int, last_seq: int, reason: str) -> None:
        self.log.append(("lost", first_seq, last_seq, reason))

    def restart(self) -> None:
        self.log.append(("restart",))


def frame(seq: int, run: bytes = b"") -> Frame:
    return Frame(seq, "", run + seq.to_bytes(8, "big"))


def ring(seqs: Iterable[int]):
    """A fetch function answering like an engine ring holding exactly `seqs`."""
    held = sorted(seqs)
    return lambda start: [frame(s) for s in held if s >= start]


def test_catch_up_forwards_the_ring_without_a_live_frame_and_skips_live_duplicates() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, ring(range(3, 7)), next_seq=1)
    repair.catch_up()
    assert link.log == [("lost", 1, 2, "replay_missing"), *(("fwd", s) for s in range(3, 7))]
    repair.on_live(frame(5))  # buffered live copies of what catch_up forwarded
    repair.on_live(frame(6))
    repair.on_live(frame(7))
    assert link.log == [("lost", 1, 2, "replay_missing"), *(("fwd", s) for s in range(3, 8))]


def test_after_catch_up_a_different_batch_with_an_old_seq_is_still_a_restart() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, ring(range(4)), next_seq=0)
    repair.catch_up()
    repair.on_live(frame(0, run=b"new engine"))
    assert link.log[4:] == [("restart",), ("fwd", 0)]


def test_catch_up_without_an_answer_changes_nothing() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, lambda start: None, next_seq=4)
    repair.catch_up()
    assert (link.log, repair.next_seq) == ([], 4)


def test_contiguous_frames_are_forwarded_without_replay() -> None:
    link = RecordingLink()
    calls: list[int] = []
    repair = SeqRepair(link, lambda s: calls.append(s) or [], next_seq=0)
    for s in range(3):
        repair.on_live(frame(s))
    assert link.log == [("fwd", 0), ("fwd", 1), ("fwd", 2)]
    assert calls == []


def test_late_start_replays_from_zero_and_records_what_the_ring_lost() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, ring(range(4, 12)), next_seq=0)
    repair.on_live(frame(7))
    repair.on_live(frame(8))
    assert link.log == [
        ("lost", 0, 3, "replay_missing"),
        ("fwd", 4),
        ("fwd", 5),
        ("fwd", 6),
        ("fwd", 7),
        ("fwd", 8),
    ]


def test_holes_inside_the_replay_answer_become_separate_gaps() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, ring([2, 3, 6]), next_seq=1)
    repair.on_live(frame(9))
    assert link.log == [
        ("lost", 1, 1, "replay_missing"),
        ("fwd", 2),
        ("fwd", 3),
        ("lost", 4, 5, "replay_missing"),
        ("fwd", 6),
        ("lost", 7, 8, "replay_missing"),
        ("fwd", 9),
    ]


def test_no_replay_answer_loses_the_whole_range() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, lambda start: None, next_seq=5)
    repair.on_live(frame(8))
    assert link.log == [("lost", 5, 7, "replay_unavailable"), ("fwd", 8)]


def test_seq_going_back_is_an_engine_restart() -> None:
    link = RecordingLink()
    repair = SeqRepair(link, ring([0, 1]), next_seq=0)  # the restarted engine's ring
    repair.on_live(frame(0))
    repair.on_live(frame(1))
    repair.on_live(frame(1))  # the new engine's seq 1: its seq 0 comes from its ring
    assert link.log == [
        ("fwd", 0),
        ("fwd", 1),
        ("restart",),
        ("fwd", 0),
        ("fwd", 1),
    ]


@settings(max_examples=200, deadline=None)
@given(
    live=st.lists(st.integers(0, 60), min_size=1, max_size=30, unique=True).map(sorted),
    held=st.sets(st.integers(0, 60)),
    start=st.integers(0, 10),
)
def test_every_seq_is_accounted_for_exactly_once(
    live: list[int], held: set[int], start: int
) -> None:
    """Increasing live seqs: seqs start..last each appear once, forwarded or lost, in order."""
    live = [s for s in live if s >= start] or [start]
    link = RecordingLink()
    repair = SeqRepair(link, ring(held), next_seq=start)
    for s in live:
        repair.on_live(frame(s))
    covered: list[int] = []
    for entry in link.log:
        if entry[0] == "fwd":
            covered.append(entry[1])
        else:
            covered.extend(range(entry[1], entry[2] + 1))
            assert not any(entry[1] <= s <= entry[2] for s in held | set(live))
    assert covered == list(range(start, live[-1] + 1))

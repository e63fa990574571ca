"""Gap repair for one engine ZMQ stream: the bridge's sequencing logic, free of I/O.

The engine numbers its batches 0, 1, 2, ... per process. `SeqRepair` sees the live
frames in arrival order and makes sure every engine seq is either forwarded exactly
once, in order, or reported lost exactly once:

- a jump (seq > next expected) asks the replay socket for the missing range; what it
  returns is forwarded, what it no longer holds is reported lost (`replay_missing`),
  everything when there is no replay socket or it does not answer (`replay_unavailable`);
- the first frame after (re)start is treated the same way, the expected seq being
  0 for a fresh bridge or the one after the last forwarded seq from the state file;
- at start, `catch_up()` asks the replay socket for everything from the expected seq at
  once, so batches the engine published while no bridge ran are forwarded even if the
  engine stays idle afterwards;
- a seq lower than expected means the engine restarted (its counter went back): the
  link starts a new epoch and repair starts again from 0. The one exception is a live
  frame the catch-up already forwarded (same seq, same bytes): it is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from kvscope.publisher.bridge.frames import Frame

log = logging.getLogger(__name__)

Fetch = Callable[[int], Iterable[Frame] | None]
"""Ask the replay socket for every buffered batch from a seq on; None: no answer."""


class Link(Protocol):
    """Where `SeqRepair` sends its outcome (the bridge's per-endpoint forwarder)."""

    def forward(self, frame: Frame) -> None:
        """Forward one engine batch; frames arrive in strictly increasing seq order."""

    def lost(self, first_seq: int, last_seq: int, reason: str) -> None:
        """Engine seqs first_seq..last_seq (inclusive) cannot be recovered."""

    def restart(self) -> None:
        """The engine restarted (seq went back): everything after this is a new epoch."""


class SeqRepair:
    """Turns one endpoint's live frames into in-order forwards and exact loss reports."""

    def __init__(self, link: Link, fetch: Fetch | None, next_seq: int = 0) -> None:
        """`next_seq`: the first engine seq not yet forwarded (0, or from the state file)."""
        self._link = link
        self._fetch = fetch
        self.next_seq = next_seq
        """The next engine seq this stream expects."""
        self._caught_up: dict[int, int] = {}
        """seq -> hash of the payload of batches `catch_up` forwarded (live duplicates)."""

    def catch_up(self) -> None:
        """Forward what the replay ring holds from next_seq on, without waiting for a live frame.

        Holes below the first batch the ring returns are reported lost; no answer changes
        nothing (the next live frame repairs as usual).
        """
        answer = self._fetch(self.next_seq) if self._fetch is not None else None
        frames = sorted((f for f in answer or () if f.seq >= self.next_seq), key=lambda f: f.seq)
        if not frames:
            return
        self.repair(frames[-1].seq, frames)
        self._caught_up = {f.seq: hash(f.payload) for f in frames}

    def on_live(self, frame: Frame) -> None:
        """Handle one live frame: detect restarts and jumps, repair, then forward it."""
        if self._caught_up:
            if self._caught_up.get(frame.seq) == hash(frame.payload):
                return  # already forwarded by catch_up
            self._caught_up = {}
        if frame.seq < self.next_seq:
            log.info(
                "engine seq went back from %d to %d: engine restarted, new epoch",
                self.next_seq - 1,
                frame.seq,
            )
            self._link.restart()
            self.next_seq = 0
        if frame.seq > self.next_seq:
            self.repair(frame.seq - 1)
        self._link.forward(frame)
        self.next_seq = frame.seq + 1

    def repair(self, last_seq: int, answer: Iterable[Frame] | None = None) -> None:
        """Recover next_seq..last_seq from the replay socket; report the rest lost.

        `answer`: a replay answer already fetched (by `catch_up`); None fetches one.
        """
        first = self.next_seq
        if answer is None and self._fetch is not None:
            answer = self._fetch(first)
        if answer is None:
            log.warning("replay unavailable: engine seqs %d..%d lost", first, last_seq)
            self._link.lost(first, last_seq, "replay_unavailable")
            self.next_seq = last_seq + 1
            return
        recovered = {f.seq: f for f in answer if first <= f.seq <= last_seq}
        log.info(
            "replay of engine seqs %d..%d recovered %d of %d",
            first,
            last_seq,
            len(recovered),
            last_seq - first + 1,
        )
        expected = first
        for seq in sorted(recovered):
            if seq > expected:
                self._link.lost(expected, seq - 1, "replay_missing")
            self._link.forward(recovered[seq])
            expected = seq + 1
        if expected <= last_seq:
            self._link.lost(expected, last_seq, "replay_missing")
        self.next_seq = last_seq + 1

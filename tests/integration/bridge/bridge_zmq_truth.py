"""Helpers of the bridge tests: a direct ZMQ subscriber (the ground truth) and `wait_for`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq
from kvscope.publisher.zmq_frames import parse_live


class DirectSubscriber:
    """A plain ZMQ subscriber that records every frame it sees (the ground truth)."""

    def __init__(self, endpoint: str) -> None:
        self.frames: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(50):
                frame = parse_live(self._sock.recv_multipart())
                self.frames[frame.seq] = frame.payload

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll `condition` until it holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)

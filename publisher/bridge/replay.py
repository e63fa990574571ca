"""A client for the engines' ZMQ replay (ROUTER) socket: "send me every batch from seq N"."""

from __future__ import annotations

import logging

import zmq
from kvscope.publisher.bridge.frames import Frame, encode_seq, parse_replay
from kvscope.publisher.bridge.metrics import REPLAYED, REPLAYS

log = logging.getLogger(__name__)


MAX_REPLAY_BATCHES = 100_000
"""Most batches one replay answer may hold (vLLM's ring keeps 10,000 by default)."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest ZMQ message accepted from a replay socket (a larger one drops the connection)."""


class ReplayClient:
    """Asks one engine's replay endpoint for buffered batches.

    Each request uses a fresh DEALER socket, so a late answer to an earlier request that
    timed out can never be mistaken for the current one (repairs are rare; the socket
    costs microseconds).
    """

    def __init__(
        self,
        context: zmq.SyncContext,
        endpoint: str,
        idle_timeout_s: float = 2.0,
        max_batches: int = MAX_REPLAY_BATCHES,
    ) -> None:
        """`idle_timeout_s`: give up when the engine sends nothing for this long;
        `max_batches`: drop an answer holding more batches than this."""
        self.max_batches = max_batches
        self._context = context
        self.endpoint = endpoint
        self._idle_timeout_ms = int(idle_timeout_s * 1000)

    def fetch(self, start_seq: int) -> list[Frame] | None:
        """Every batch the engine still buffers with seq >= start_seq, in its order.

        None when the engine did not answer completely in time (nothing can be trusted).
        """
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            sock.connect(self.endpoint)
            sock.send_multipart([b"", encode_seq(start_seq)])
            frames: list[Frame] = []
            while True:
                if not sock.poll(self._idle_timeout_ms):
                    log.warning(
                        "replay from %s timed out after %d batches", self.endpoint, len(frames)
                    )
                    REPLAYS.labels(self.endpoint, "timeout").inc()
                    return None
                # The ROUTER's empty delimiter frame comes first; the answer follows it.
                frame = parse_replay(sock.recv_multipart()[1:])
                if frame is None:
                    REPLAYS.labels(self.endpoint, "ok").inc()
                    REPLAYED.labels(self.endpoint).inc(len(frames))
                    return frames
                frames.append(frame)
                if len(frames) > self.max_batches:
                    log.warning(
                        "replay from %s sent over %d batches: answer dropped",
                        self.endpoint,
                        self.max_batches,
                    )
                    REPLAYS.labels(self.endpoint, "too_large").inc()
                    return None
        except (ValueError, zmq.ZMQError) as exc:
            log.warning("replay from %s failed: %s", self.endpoint, exc)
            REPLAYS.labels(self.endpoint, "error").inc()
            return None
        finally:
            sock.close()

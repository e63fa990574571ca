"""`TransferTimer`: per-request KV-transfer latency measured inside a connector.

A connector calls `begin(request_id, chunk)` when a chunk enters its transfer stack and
`end(request_id, chunk, bytes=..., blocks=...)` when it leaves. The timer counts only the
time during which at least one chunk of the request is inside the stack (overlapping
chunks count once; waits between chunks, e.g. in the scheduler, not at all), as SGLang
PR #7944 proposed. When the last chunk lands (`last=True`, or the `expected_chunks`
given to the first `begin` are done) it publishes one `KVTransfer` (status ok) and
observes `kvscope_kv_transfer_latency_seconds`; `fail()` publishes a failed or aborted
one instead. Thread-safe; never raises into the connector.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kvscope.common.metrics import histogram
from kvscope.publisher.base import Publisher
from kvscope.schemas import KVTransfer
from prometheus_client import Histogram

log = logging.getLogger(__name__)

Status = Literal["ok", "failed", "aborted"]
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def transfer_latency_histogram() -> Histogram:
    """`kvscope_kv_transfer_latency_seconds{backend,status,src_instance,dst_instance}`.

    Registered once per process. Labelled per prefill -> decode pair so that alerts can
    name the slow pair (docker/prometheus/kvscope.rules.yml); the cardinality is the
    number of pairs an instance transfers with.
    """
    return histogram(
        "kvscope_kv_transfer_latency_seconds",
        "Time a request's KV transfer spent inside the transfer stack (sum over chunks)",
        ("backend", "status", "src_instance", "dst_instance"),
        buckets=LATENCY_BUCKETS,
    )


@dataclass
class _Transfer:
    """What the timer knows about one request's transfer so far."""

    src: str
    dst: str
    expected_chunks: int | None
    start_ts: float
    open_chunks: set[object] = field(default_factory=set)
    busy_since: float = 0.0
    inside_s: float = 0.0
    chunks: int = 0
    bytes: int = 0
    blocks: int = 0


class TransferTimer:
    """Times KV transfers per request and chunk; publishes one `KVTransfer` per request."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        backend: str,
        src_instance: str = "",
        dst_instance: str = "",
        max_pending: int = 100_000,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._publisher = publisher
        self._backend = backend
        self._src = src_instance
        self._dst = dst_instance
        self._max_pending = max_pending
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Transfer] = OrderedDict()
        self._histogram = transfer_latency_histogram()

    def begin(
        self,
        request_id: str,
        chunk: object = 0,
        *,
        expected_chunks: int | None = None,
        src_instance: str | None = None,
        dst_instance: str | None = None,
    ) -> None:
        """A chunk of `request_id` enters the transfer stack (the first call opens the request)."""
        evicted: list[tuple[str, _Transfer]] = []
        with self._lock:
            transfer = self._pending.get(request_id)
            if transfer is None:
                transfer = _Transfer(
                    src=self._src if src_instance is None else src_instance,
                    dst=self._dst if dst_instance is None else dst_instance,
                    expected_chunks=expected_chunks,
                    start_ts=self._wall(),
                )
                self._pending[request_id] = transfer
                while len(self._pending) > self._max_pending:
                    evicted.append(self._pending.popitem(last=False))
            elif expected_chunks is not None:
                transfer.expected_chunks = expected_chunks
            if not transfer.open_chunks:
                transfer.busy_since = self._clock()
            transfer.open_chunks.add(chunk)
        for old_id, old in evicted:
            self._emit(old_id, old, "aborted")

    def end(
        self,
        request_id: str,
        chunk: object = 0,
        *,
        bytes: int = 0,
        blocks: int = 0,
        last: bool = False,
    ) -> None:
        """A chunk leaves the stack; on the last chunk the request's `KVTransfer` is published."""
        with self._lock:
            transfer = self._pending.get(request_id)
            if transfer is None or chunk not in transfer.open_chunks:
                return
            self._close_chunk(transfer, chunk)
            transfer.chunks += 1
            transfer.bytes += bytes
            transfer.blocks += blocks
            done = last or (
                transfer.expected_chunks is not None and transfer.chunks >= transfer.expected_chunks
            )
            if done:
                del self._pending[request_id]
        if done:
            self._emit(request_id, transfer, "ok")

    def fail(self, request_id: str, status: Status = "failed") -> None:
        """The transfer failed or was aborted: publish what was measured with that status."""
        with self._lock:
            transfer = self._pending.pop(request_id, None)
            if transfer is None:
                return
            for chunk in list(transfer.open_chunks):
                self._close_chunk(transfer, chunk)
        self._emit(request_id, transfer, status)

    def pending(self) -> int:
        """Requests with a transfer under way."""
        return len(self._pending)

    def _close_chunk(self, transfer: _Transfer, chunk: object) -> None:
        transfer.open_chunks.discard(chunk)
        if not transfer.open_chunks:
            transfer.inside_s += self._clock() - transfer.busy_since

    def _emit(self, request_id: str, transfer: _Transfer, status: Status) -> None:
        try:
            self._publisher.publish(
                KVTransfer(
                    request_id=request_id,
                    src_instance=transfer.src,
                    dst_instance=transfer.dst,
                    backend=self._backend,
                    bytes=transfer.bytes,
                    blocks=transfer.blocks,
                    chunks=transfer.chunks,
                    start_ts=transfer.start_ts,
                    end_ts=self._wall(),
                    latency_s=max(0.0, transfer.inside_s),
                    status=status,
                )
            )
            self._histogram.labels(
                backend=self._backend,
                status=status,
                src_instance=transfer.src,
                dst_instance=transfer.dst,
            ).observe(transfer.inside_s)
        except Exception:
            log.warning("kvscope transfer timer could not publish %s", request_id, exc_info=True)

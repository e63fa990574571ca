"""Pause bookkeeping in one place: why each partition is paused.

A partition can be paused for several reasons at once (positioning after an assignment,
a failing sink); it resumes only when no reason is left, so one reason ending can never
resume fetching that another reason still forbids (the OpenTelemetry Kafka receiver's
`partition_pause.go` pattern).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Final

POSITIONING: Final = "positioning"
"""Assigned, not yet sought to the resume position."""
SINK_FAILING: Final = "sink_failing"
"""ClickHouse inserts fail: hold records in Kafka instead of memory."""


class PauseReasons:
    """The set of reasons each partition is paused for."""

    def __init__(self) -> None:
        self._reasons: dict[Hashable, set[str]] = {}

    def add(self, partitions: Iterable[Hashable], reason: str) -> list[Hashable]:
        """Pause `partitions` for `reason`; return those that were running until now."""
        newly = []
        for tp in partitions:
            reasons = self._reasons.setdefault(tp, set())
            if not reasons:
                newly.append(tp)
            reasons.add(reason)
        return newly

    def remove(self, partitions: Iterable[Hashable], reason: str) -> list[Hashable]:
        """Lift `reason` from `partitions`; return those with no reason left (to resume)."""
        free = []
        for tp in partitions:
            reasons = self._reasons.get(tp)
            if reasons is None:
                continue
            reasons.discard(reason)
            if not reasons:
                del self._reasons[tp]
                free.append(tp)
        return free

    def forget(self, partitions: Iterable[Hashable]) -> None:
        """Partitions were revoked: their pauses go with them."""
        for tp in partitions:
            self._reasons.pop(tp, None)

    def paused(self) -> set[Hashable]:
        """Partitions paused for at least one reason."""
        return set(self._reasons)

    def why(self, partition: Hashable) -> frozenset[str]:
        """The reasons `partition` is paused for (empty if it is running)."""
        return frozenset(self._reasons.get(partition, ()))

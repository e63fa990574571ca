"""The limits every envelope shares, at and just past each bound, for every stream."""

from __future__ import annotations

import math
from typing import Any

import pytest
from kvscope.collector.pipeline.checks import violation
from kvscope.schemas import EngineStats, Envelope, Gap, KVEventBatch, Source
from kvscope.schemas.limits import MAX_DP_RANK, MAX_NAME_CHARS, MAX_SEQ, TS_MAX, TS_MIN

BODIES = {"kv-events": KVEventBatch(1.0, []), "engine-stats": EngineStats(1, 16, 0.5)}
NAMES = ("instance", "model", "engine", "engine_version")


def _envelope(body: Any, seq: int = 0, ts: float = 1.0, **source: Any) -> Envelope:
    return Envelope(
        source=Source(**{"instance": "a", **source}), epoch=1, seq=seq, ts=ts, body=body
    )


@pytest.mark.parametrize("stream", list(BODIES))
@pytest.mark.parametrize("gap", [False, True])
def test_values_at_every_bound_fit(stream: str, gap: bool) -> None:
    body = Gap(first_seq=1, last_seq=2) if gap else BODIES[stream]
    names = {name: "n" * MAX_NAME_CHARS for name in NAMES}
    for ts in (TS_MIN, math.nextafter(TS_MAX, 0)):
        envelope = _envelope(body, seq=MAX_SEQ, ts=ts, dp_rank=MAX_DP_RANK, **names)
        assert violation(stream, envelope, 100) is None


@pytest.mark.parametrize("stream", list(BODIES))
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        *[
            (
                {name: "n" * (MAX_NAME_CHARS + 1)},
                f"source.{name} has {MAX_NAME_CHARS + 1} characters",
            )
            for name in NAMES
        ],
        ({"dp_rank": MAX_DP_RANK + 1}, f"source.dp_rank {MAX_DP_RANK + 1} exceeds"),
        ({"seq": MAX_SEQ + 1}, f"seq {MAX_SEQ + 1} exceeds"),
        *[
            ({"ts": ts}, f"ts {ts!r} is outside")
            for ts in (math.nan, math.inf, -math.inf, TS_MAX, -1.0)
        ],
    ],
)
def test_each_value_past_its_bound_is_named(stream: str, change: dict, reason: str) -> None:
    problem = violation(stream, _envelope(BODIES[stream], **change), 100)
    assert problem is not None and problem.startswith(reason)

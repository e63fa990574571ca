"""`stream_of`: every body type maps to its own stream; a Gap has none."""

from __future__ import annotations

import pytest
from kvscope import schemas
from kvscope.schemas import STREAM_BODIES, Gap, stream_of

SAMPLES = [
    schemas.KVEventBatch(ts=1.0, events=[]),
    schemas.EngineStats(capacity_blocks=1, block_size=16, usage=0.0),
    schemas.RequestFinished(request_id="r", prompt_tokens=3),
    schemas.KVTransfer(request_id="r", src_instance="a", dst_instance="b"),
    schemas.EngineMetric(metric="m"),
    schemas.BlockAccess(request_id="r", prompt_tokens=3, block_size=16),
]


@pytest.mark.parametrize("body", SAMPLES, ids=lambda b: type(b).__name__)
def test_each_body_maps_to_the_stream_that_carries_its_type(body: object) -> None:
    stream = stream_of(body)
    assert STREAM_BODIES[stream] is type(body)


def test_every_stream_has_a_sample() -> None:
    assert sorted(stream_of(b) for b in SAMPLES) == sorted(STREAM_BODIES)


@pytest.mark.parametrize("body", [Gap(first_seq=1, last_seq=2, reason="x"), object(), "text"])
def test_bodies_without_a_stream_are_refused(body: object) -> None:
    with pytest.raises(ValueError, match="has no stream of its own"):
        stream_of(body)

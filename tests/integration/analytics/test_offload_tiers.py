"""Two offloading tiers of one medium stay apart, from the engine's events to `residency`.

vLLM 0.32's offloading connector reports an FS tier and an object-store tier both as
medium STORAGE, told apart only by `locality` and `ownership`. One block, stored in both
tiers and then removed from one, must stay resident in the other. Before the tier was
kept, the second store read as the same tier storing the block again (ending the first
interval as `restored`) and the removal ended the only interval left: nothing resident.
"""

from __future__ import annotations

from typing import Any

import pytest
from kvscope.analytics.queries import run_query
from kvscope.collector.pipeline.direct_sink import DirectSink
from kvscope.collector.storage import residency
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import BlockRemoved, BlockStored, KVEventBatch, Source
from support.analytics_kit import FAR_FUTURE

T0 = 1_780_000_000.0
H = 0xABCDEF


@pytest.mark.parametrize("removed_from", ["fs-1", "REMOTE/obj-1"])
def test_a_block_removed_from_one_tier_stays_resident_in_the_other(
    removed_from: str, clickhouse: Any, clickhouse_url: str
) -> None:
    migrate(clickhouse, parse_target(clickhouse_url))
    sink = DirectSink(clickhouse)
    source = Source(instance="offload", model="m")
    bodies = [
        BlockStored(block_hashes=[H], medium="DISK", medium_raw="STORAGE", tier="fs-1"),
        BlockStored(block_hashes=[H], medium="DISK", medium_raw="STORAGE", tier="REMOTE/obj-1"),
        BlockRemoved(block_hashes=[H], medium="DISK", medium_raw="STORAGE", tier=removed_from),
    ]
    for i, event in enumerate(bodies):
        sink(source, 1, KVEventBatch(ts=T0 + i, events=[event]), T0 + i)
    sink.close()
    residency.refresh(clickhouse)

    rows = run_query(clickhouse, "residency", {"until": FAR_FUTURE})
    by_medium = {r["medium"]: (r["intervals"], r["still_resident"]) for r in rows}
    kept = "REMOTE/obj-1" if removed_from == "fs-1" else "fs-1"
    assert by_medium == {f"DISK/{removed_from}": (1, 0), f"DISK/{kept}": (1, 1)}
    ended = {r["medium"]: r["ended_by_removal"] for r in rows}
    assert ended == {f"DISK/{removed_from}": 1, f"DISK/{kept}": 0}

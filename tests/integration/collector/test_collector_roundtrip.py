"""Round trip through the real broker and real chDB: every stream, field for field."""

from __future__ import annotations

import asyncio
from typing import Any

from kvscope.collector.pipeline.service import Collector
from kvscope.collector.pipeline.write import ClickHouseSink
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.store import ChdbStore
from kvscope.collector.storage.target import parse_target
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineStats,
    Gap,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
)
from prometheus_client import REGISTRY
from support.collector_testkit import collector_config, envelope, publish_envelopes

U64 = 2**64 - 1
BIG_BYTES = 2**63 + 1
"""Past Int64, yet the minute sum with the other transfer (10 bytes) still fits UInt64: the
aggregate's exact sum is checked, not a wrap-around."""
SRC = Source(instance="pod-ä/0", model="llama", role="prefill", dp_rank=65535, engine="sglang")
OTHER = Source(instance="i2")
T0 = 1_763_700_000.123456


def _samples(topics: str) -> dict[str, float]:
    """The collector's Prometheus counters this test checks (process-wide, so compare deltas)."""

    def get(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    prefix = "kvscope_collector_"
    return {
        "consumed kv": get(f"{prefix}records_consumed_total", {"topic": f"{topics}kv-events"}),
        "consumed requests": get(f"{prefix}records_consumed_total", {"topic": f"{topics}requests"}),
        "inserted kv": get(f"{prefix}rows_inserted_total", {"table": "kv_block_events"}),
        "inserted gaps": get(f"{prefix}rows_inserted_total", {"table": "stream_gaps"}),
        "gaps collector": get(f"{prefix}gaps_total", {"detected_by": "collector"}),
        "gaps publisher": get(f"{prefix}gaps_total", {"detected_by": "publisher"}),
        "decode errors": get(f"{prefix}errors_total", {"kind": "decode"}),
    }


def _us(ts: float) -> int:
    return round(ts * 1e6)


def _kv_envelopes() -> list[Any]:
    batch1 = KVEventBatch(
        ts=T0,
        events=[
            BlockStored(
                block_hashes=[U64, 2**63, 0, 1],
                parent_block_hash=2**63 + 5,
                block_size=16,
                token_count=50,
                medium="CPU",
                medium_raw="CPU_PINNED",
                lora_name="adapter",
                group_idx=3,
            ),
            BlockRemoved(block_hashes=[U64], medium="DISK", medium_raw="STORAGE", group_idx=0),
            AllBlocksCleared(),
            BlockStored(block_hashes=[], block_size=16),
            BlockStored(block_hashes=[7, 8], token_count=5),
        ],
    )
    batch2 = KVEventBatch(ts=T0 + 61, events=[BlockRemoved(block_hashes=[2**63 - 1])])
    return [
        envelope(SRC, U64, 0, T0, batch1),
        envelope(SRC, U64, 1, T0 + 61, batch2),
        envelope(SRC, U64, 4, T0 + 62, batch2),
        envelope(OTHER, 0, 0, 0.0, KVEventBatch(ts=0.0, events=[AllBlocksCleared()])),
    ]


# (event, block_hash, parent_hash, block_size, tokens, medium, medium_raw, lora, group);
# parent_hash is the event's parent, on its first row only
EXPECTED_KV = [
    (0, 0, 0, "stored", U64, 2**63 + 5, 16, 16, "CPU", "CPU_PINNED", "adapter", 3),
    (0, 0, 1, "stored", 2**63, 0, 16, 16, "CPU", "CPU_PINNED", "adapter", 3),
    (0, 0, 2, "stored", 0, 0, 16, 16, "CPU", "CPU_PINNED", "adapter", 3),
    (0, 0, 3, "stored", 1, 0, 16, 2, "CPU", "CPU_PINNED", "adapter", 3),
    (0, 1, 0, "removed", U64, 0, 0, 0, "DISK", "STORAGE", "", 0),
    (0, 2, 0, "cleared", 0, 0, 0, 0, "", "", "", -1),
    (0, 4, 0, "stored", 7, 0, 0, 5, "GPU", "", "", -1),
    (0, 4, 1, "stored", 8, 0, 0, 0, "GPU", "", "", -1),
    (1, 0, 0, "removed", 2**63 - 1, 0, 0, 0, "GPU", "", "", -1),
    (4, 0, 0, "removed", 2**63 - 1, 0, 0, 0, "GPU", "", "", -1),
]


def test_round_trip_all_streams(
    bootstrap_servers: str, topic_prefix: str, clickhouse: Any, clickhouse_url: str
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    stats = [
        envelope(SRC, 7, 0, T0, EngineStats(capacity_blocks=U64, block_size=32, usage=1.0)),
        envelope(
            SRC,
            7,
            1,
            T0 + 1,
            EngineStats(
                capacity_blocks=0,
                block_size=0,
                usage=0.0,
                running=2**32 - 1,
                waiting=3,
                prefix_queries_delta=U64,
                prefix_hits_delta=5,
                preemptions_delta=1,
                interval_s=0.5,
            ),
        ),
    ]
    requests = [
        envelope(
            SRC,
            7,
            0,
            T0,
            RequestFinished(
                request_id="req-ü-1",
                prompt_tokens=2**32 - 1,
                cached_tokens=4,
                output_tokens=9,
                ttft_s=0.25,
                queue_s=0.01,
                prefill_s=0.2,
                decode_s=1.5,
                e2e_s=1.75,
                finish_reason="stop",
            ),
        ),
        envelope(SRC, 7, 1, T0, RequestFinished(request_id="", prompt_tokens=0)),
        envelope(SRC, 7, 2, T0 + 1, Gap(first_seq=10, last_seq=19, reason="queue_full")),
    ]
    transfers = [
        envelope(
            SRC,
            7,
            0,
            T0,
            KVTransfer(
                request_id="r1",
                src_instance="p0",
                dst_instance="d0",
                backend="nixl",
                bytes=BIG_BYTES,
                blocks=4,
                chunks=2,
                start_ts=T0 - 0.5,
                end_ts=T0,
                latency_s=0.125,
                status="failed",
            ),
        ),
        envelope(
            SRC,
            7,
            1,
            T0 + 2,
            KVTransfer(
                request_id="r2",
                src_instance="p0",
                dst_instance="d0",
                backend="nixl",
                bytes=10,
                latency_s=0.5,
            ),
        ),
    ]

    async def scenario() -> None:
        for stream, envs in [
            ("kv-events", _kv_envelopes()),
            ("engine-stats", stats),
            ("requests", requests),
            ("kv-transfers", transfers),
        ]:
            await publish_envelopes(bootstrap_servers, topic_prefix, stream, envs)
        config = collector_config(bootstrap_servers, clickhouse_url, topic_prefix)
        await Collector(config, sink=ClickHouseSink(ChdbStore(clickhouse))).run()

    before = _samples(topic_prefix)
    asyncio.run(scenario())
    after = _samples(topic_prefix)
    assert {k: after[k] - before[k] for k in after} == {
        "consumed kv": 4,
        "consumed requests": 3,
        "inserted kv": 11,
        "inserted gaps": 2,
        "gaps collector": 1,
        "gaps publisher": 1,
        "decode errors": 0,
    }

    kv = clickhouse.query(
        "SELECT seq, event_index, position, toString(event), block_hash, parent_hash, block_size,"
        " tokens, medium, medium_raw, lora_name, group_idx FROM kv_block_events"
        " WHERE instance = {i:String} ORDER BY _offset, event_index, position",
        parameters={"i": SRC.instance},
    ).result_rows
    assert kv == EXPECTED_KV
    source = clickhouse.query(
        "SELECT DISTINCT instance, dp_rank, model, role, engine, epoch, _topic"
        " FROM kv_block_events WHERE instance = {i:String}",
        parameters={"i": SRC.instance},
    ).result_rows
    assert source == [
        (SRC.instance, 65535, "llama", "prefill", "sglang", U64, f"{topic_prefix}kv-events")
    ]
    ts = clickhouse.query(
        "SELECT seq, toUnixTimestamp64Micro(ts) FROM kv_block_events"
        " WHERE instance = {i:String} AND event_index = 0 AND position = 0 ORDER BY seq",
        parameters={"i": SRC.instance},
    ).result_rows
    assert ts == [(0, _us(T0)), (1, _us(T0 + 61)), (4, _us(T0 + 62))]
    other = clickhouse.query(
        "SELECT toString(event), toUnixTimestamp64Micro(ts), model, role, engine, dp_rank"
        " FROM kv_block_events WHERE instance = 'i2'"
    ).result_rows
    assert other == [("cleared", 0, "", "both", "vllm", 0)]

    assert clickhouse.query(
        "SELECT capacity_blocks, block_size, usage, running, waiting, prefix_queries,"
        " prefix_hits, preemptions, interval_s FROM engine_stats ORDER BY seq"
    ).result_rows == [
        (U64, 32, 1.0, 0, 0, 0, 0, 0, 0.0),
        (0, 0, 0.0, 2**32 - 1, 3, U64, 5, 1, 0.5),
    ]
    assert clickhouse.query(
        "SELECT request_id, prompt_tokens, cached_tokens, output_tokens, ttft_s, queue_s,"
        " prefill_s, decode_s, e2e_s, finish_reason FROM requests ORDER BY seq"
    ).result_rows == [
        ("req-ü-1", 2**32 - 1, 4, 9, 0.25, 0.01, 0.2, 1.5, 1.75, "stop"),
        ("", 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, ""),
    ]
    assert clickhouse.query(
        "SELECT request_id, src_instance, dst_instance, backend, bytes, blocks, chunks,"
        " toUnixTimestamp64Micro(start_ts), toUnixTimestamp64Micro(end_ts), latency_s, status"
        " FROM kv_transfers ORDER BY seq"
    ).result_rows == [
        ("r1", "p0", "d0", "nixl", BIG_BYTES, 4, 2, _us(T0 - 0.5), _us(T0), 0.125, "failed"),
        ("r2", "p0", "d0", "nixl", 10, 0, 0, 0, 0, 0.5, "ok"),
    ]
    gaps = clickhouse.query(
        "SELECT stream, instance, epoch, first_seq, last_seq, reason, detected_by"
        " FROM stream_gaps ORDER BY stream, first_seq"
    ).result_rows
    assert gaps == [
        ("kv-events", SRC.instance, U64, 2, 3, "seq_hole", "collector"),
        ("requests", SRC.instance, 7, 10, 19, "queue_full", "publisher"),
    ]
    assert clickhouse.query("SELECT count() FROM ingest_errors").result_rows == [(0,)]

    agg = clickhouse.query(
        "SELECT instance, medium, sum(stores), sum(removals), sum(clears) FROM kv_block_events_1m"
        " GROUP BY instance, medium ORDER BY instance, medium"
    ).result_rows
    assert agg == [
        ("i2", "", 0, 0, 1),
        (SRC.instance, "", 0, 0, 1),
        (SRC.instance, "CPU", 4, 0, 0),
        (SRC.instance, "DISK", 0, 1, 0),
        (SRC.instance, "GPU", 2, 2, 0),
    ]
    latency = clickhouse.query(
        "SELECT src_instance, dst_instance, backend, sum(transfers), sum(bytes), max(max_latency),"
        " quantilesTDigestMerge(0.5, 0.9, 0.99)(latency)[3]"
        " FROM kv_transfer_latency_1m GROUP BY src_instance, dst_instance, backend"
    ).result_rows
    assert latency[0][:6] == ("p0", "d0", "nixl", 2, BIG_BYTES + 10, 0.5)
    assert 0.125 <= latency[0][6] <= 0.5

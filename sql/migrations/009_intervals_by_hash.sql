-- kvscope migration 009: kv_block_intervals_by_hash, the closed intervals again in block-hash order, for routing_opportunity.
--
-- routing_opportunity orders every interval overlapping its window by (hash, model/role/
-- medium group, start): read from kv_block_intervals, whose rows are in source order within
-- each hour of end_ts, that sort was the query's cost (1.6 s for one hour of 100M block
-- events, 14-16 s for all of it). Here the rows of each hour of end_ts are already in that
-- order, with only the columns the query needs as 64-bit keys, and the sort costs a
-- fraction of it (docs/benchmarks.md, "Routing opportunity in hash order").
-- Written by the residency publish from the same stage as kv_block_intervals, with the same
-- generation and a deduplication token of its own (sql/residency/publish.sql).
CREATE TABLE IF NOT EXISTS kv_block_intervals_by_hash
(
    model LowCardinality(String),
    block_hash UInt64 CODEC(LZ4),
    group_key UInt64 CODEC(LZ4),
    source_id UInt64 CODEC(LZ4),
    start_ts DateTime64(6, 'UTC') CODEC(Delta, LZ4),
    end_ts DateTime64(6, 'UTC') CODEC(Delta, LZ4),
    tokens UInt32 CODEC(T64, LZ4),
    generation UInt64 CODEC(T64, LZ4)
)
ENGINE = MergeTree
PARTITION BY toDate(end_ts)
ORDER BY (toStartOfHour(end_ts), block_hash, group_key, start_ts)
SETTINGS non_replicated_deduplication_window = 10000;

-- Residency derived before this migration: its committed closed intervals are copied (a
-- generation whose publish a crash interrupted is written by the refresh that finishes it,
-- from its stage). Emptied first, so that a migration interrupted here copies them once
-- when it runs again.
TRUNCATE TABLE kv_block_intervals_by_hash;
INSERT INTO kv_block_intervals_by_hash
    (model, block_hash, group_key, source_id, start_ts, end_ts, tokens, generation)
SELECT
    model, block_hash, cityHash64(model, role, medium), cityHash64(instance, dp_rank),
    start_ts, end_ts, tokens, generation
FROM kv_block_intervals
WHERE generation <= (SELECT max(generation) FROM kv_residency_progress);

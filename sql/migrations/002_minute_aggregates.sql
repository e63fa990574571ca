-- kvscope migration 002: per-minute aggregates kept by materialized views.
--
-- The views fire on every insert into the raw tables. Retried inserts carry the same
-- insert_deduplication_token and the collector sets
-- deduplicate_blocks_in_dependent_materialized_views = 1, so the aggregate tables
-- (which keep a deduplication window too) are not doubled by retries either.
-- Read them with the -Merge combinators / sum(), grouped by their key.

CREATE TABLE IF NOT EXISTS kv_transfer_latency_1m
(
    minute DateTime('UTC'),
    src_instance LowCardinality(String),
    dst_instance LowCardinality(String),
    backend LowCardinality(String),
    transfers SimpleAggregateFunction(sum, UInt64),
    bytes SimpleAggregateFunction(sum, UInt64),
    latency AggregateFunction(quantilesTDigest(0.5, 0.9, 0.99), Float64),
    max_latency SimpleAggregateFunction(max, Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (src_instance, dst_instance, backend, minute)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS kv_transfer_latency_1m_mv TO kv_transfer_latency_1m AS
SELECT
    toStartOfMinute(ts) AS minute,
    src_instance,
    dst_instance,
    backend,
    toUInt64(count()) AS transfers,
    toUInt64(sum(bytes)) AS bytes,
    quantilesTDigestState(0.5, 0.9, 0.99)(latency_s) AS latency,
    max(latency_s) AS max_latency
FROM kv_transfers
GROUP BY minute, src_instance, dst_instance, backend;

CREATE TABLE IF NOT EXISTS kv_block_events_1m
(
    minute DateTime('UTC'),
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    medium LowCardinality(String),
    stores SimpleAggregateFunction(sum, UInt64),
    removals SimpleAggregateFunction(sum, UInt64),
    clears SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (instance, dp_rank, model, medium, minute)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS kv_block_events_1m_mv TO kv_block_events_1m AS
SELECT
    toStartOfMinute(ts) AS minute,
    instance,
    dp_rank,
    model,
    medium,
    toUInt64(countIf(event = 'stored')) AS stores,
    toUInt64(countIf(event = 'removed')) AS removals,
    toUInt64(countIf(event = 'cleared')) AS clears
FROM kv_block_events
GROUP BY minute, instance, dp_rank, model, medium;

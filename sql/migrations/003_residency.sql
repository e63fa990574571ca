-- kvscope migration 003: residency intervals materialized in closed increments.
--
-- The raw kv_block_events table stays the source of truth; these tables are derived from
-- it by `kvscope.collector.storage.residency` (refresh after every stored plan, `kvscope
-- derive --rebuild` from scratch) and read by the interval queries instead of window
-- functions over every event. docs/analytics.md ("Materialized residency") documents
-- every column; the capacity what-if reads them through `_block_intervals.sql`.
--
-- A refresh is one generation: it computes its rows into the *_stage tables from the
-- committed state, then publishes them (INSERT ... SELECT with a deduplication token per
-- table and generation) and commits by inserting kv_residency_progress rows last. A crash
-- while staging leaves garbage only in the stage tables (truncated next time); a crash
-- while publishing is finished by the next refresh from the same stage (the tokens drop
-- what was already published). Readers ignore generations above the committed one.

CREATE TABLE IF NOT EXISTS kv_block_intervals
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    epoch UInt64,
    medium LowCardinality(String),
    block_hash UInt64 CODEC(ZSTD(1)),
    tokens UInt32 CODEC(T64, ZSTD(1)),
    start_ts DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    end_ts DateTime64(6, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    end_kind Enum8('removed' = 1, 'cleared' = 2, 'restored' = 3),
    refault UInt8,
    refault_distance UInt64 CODEC(T64, ZSTD(1)),
    store_ord UInt64 CODEC(T64, ZSTD(1)),
    removal_ord UInt64 CODEC(T64, ZSTD(1)),
    generation UInt64 CODEC(T64, ZSTD(1)),
    INDEX start_minmax start_ts TYPE minmax GRANULARITY 1,
    INDEX generation_minmax generation TYPE minmax GRANULARITY 1
)
ENGINE = MergeTree
PARTITION BY toDate(end_ts)
ORDER BY (toStartOfHour(end_ts), instance, dp_rank, epoch, medium, block_hash)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_open
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    epoch UInt64,
    medium LowCardinality(String),
    block_hash UInt64,
    tokens UInt32,
    start_ts DateTime64(6, 'UTC'),
    refault UInt8,
    refault_distance UInt64,
    store_ord UInt64,
    removal_ord UInt64,
    clear_gen UInt64,
    version UInt64,
    is_deleted UInt8,
    generation UInt64
)
ENGINE = ReplacingMergeTree(version, is_deleted)
ORDER BY (instance, dp_rank, epoch, medium, block_hash)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_evicted
(
    instance LowCardinality(String),
    dp_rank UInt16,
    epoch UInt64,
    medium LowCardinality(String),
    block_hash UInt64,
    removal_ord UInt64,
    removals_so_far UInt64,
    clear_gen UInt64,
    generation UInt64
)
ENGINE = ReplacingMergeTree(removal_ord)
ORDER BY (instance, dp_rank, epoch, medium, block_hash)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_residency_progress
(
    instance LowCardinality(String),
    dp_rank UInt16,
    epoch UInt64,
    last_seq UInt64,
    events UInt64,
    removals UInt64,
    clears UInt64,
    first_ts DateTime64(6, 'UTC'),
    last_ts DateTime64(6, 'UTC'),
    generation UInt64
)
ENGINE = MergeTree
ORDER BY (instance, dp_rank, epoch, generation)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_residency_stage_events
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    event Enum8('stored' = 1, 'removed' = 2, 'cleared' = 3),
    medium LowCardinality(String),
    block_hash UInt64,
    tokens UInt32,
    ord UInt64,
    clear_gen UInt64,
    removals_so_far UInt64
)
ENGINE = MergeTree
ORDER BY (instance, dp_rank, epoch, ord);

CREATE TABLE IF NOT EXISTS kv_block_intervals_stage AS kv_block_intervals
ENGINE = MergeTree ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_block_open_stage AS kv_block_open
ENGINE = MergeTree ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_block_evicted_stage AS kv_block_evicted
ENGINE = MergeTree ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_residency_progress_stage AS kv_residency_progress
ENGINE = MergeTree ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_residency_stage_candidates
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    epoch UInt64,
    medium LowCardinality(String),
    block_hash UInt64,
    tokens UInt32,
    start_ts DateTime64(6, 'UTC'),
    end_ts DateTime64(6, 'UTC'),
    end_kind Enum8('open' = 0, 'removed' = 1, 'cleared' = 2, 'restored' = 3),
    refault UInt8,
    refault_distance UInt64,
    store_ord UInt64,
    removal_ord UInt64,
    clear_gen UInt64,
    end_ord UInt64,
    prior UInt8
)
ENGINE = MergeTree
ORDER BY tuple();

-- Storage of the raw block events: codecs per column (new parts; old parts as they merge).
-- block_hash is random (~8 bytes, left LZ4); parent_hash is stored on an event's first row
-- only (0 elsewhere), so it compresses to almost nothing; times and positions are deltas.
ALTER TABLE kv_block_events
    MODIFY COLUMN parent_hash CODEC(ZSTD(1)),
    MODIFY COLUMN ts CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN seq CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN _offset CODEC(DoubleDelta, ZSTD(1)),
    MODIFY COLUMN event_index CODEC(T64, ZSTD(1)),
    MODIFY COLUMN position CODEC(T64, ZSTD(1)),
    MODIFY COLUMN tokens CODEC(T64, ZSTD(1)),
    MODIFY COLUMN block_size CODEC(T64, ZSTD(1)),
    MODIFY COLUMN epoch CODEC(ZSTD(1)),
    MODIFY COLUMN group_idx CODEC(ZSTD(1));

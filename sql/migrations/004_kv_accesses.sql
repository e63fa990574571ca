-- kvscope migration 004: kv_accesses, the raw table of stream kv-accesses (opt-in).
--
-- One row per BlockAccess record: one request's use of one source's KV cache, published
-- when the request released its blocks: the full-block hashes it looked up and produced
-- (prompt first), how many leading blocks hit at its prefix lookup, how many blocks it
-- held, and when it arrived, was looked up and released. `capacity_what_if` replays these
-- through block pools of other sizes (cachemodel/access_replay.py). Same source
-- columns, Kafka position, partitioning, dedup window and kafka_state projection as the
-- other raw tables (see 001_raw_tables.sql).

CREATE TABLE IF NOT EXISTS kv_accesses
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    engine LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    request_id String,
    prompt_tokens UInt32,
    block_size UInt32,
    hit_blocks UInt32,
    held_blocks UInt32,
    block_hashes Array(UInt64),
    arrival_ts DateTime64(6, 'UTC'),
    lookup_ts DateTime64(6, 'UTC'),
    free_ts DateTime64(6, 'UTC'),
    held_until_free UInt8,
    _topic LowCardinality(String),
    _partition UInt32,
    _offset UInt64,
    PROJECTION kafka_state
    (
        SELECT _topic, _partition, instance, dp_rank, epoch, max(_offset), max(seq)
        GROUP BY _topic, _partition, instance, dp_rank, epoch
    )
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, epoch, seq)
SETTINGS non_replicated_deduplication_window = 10000;

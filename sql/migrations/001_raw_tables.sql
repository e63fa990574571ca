-- kvscope migration 001: the raw tables of the four streams, stream_gaps and ingest_errors.
--
-- Every raw row carries its source and its Kafka position (_topic, _partition, _offset):
-- the collector resumes from the largest stored offset, which makes ingestion exactly
-- once. non_replicated_deduplication_window keeps the hashes of recent inserts so a
-- retried insert with the same insert_deduplication_token is dropped, not doubled.
-- Raw tables are partitioned by day of the engine timestamp (TTL drops whole days);
-- stream_gaps and ingest_errors are small and unpartitioned. The kafka_state projection
-- answers "largest stored offset / seq per partition and source" without a full scan.

CREATE TABLE IF NOT EXISTS kv_block_events
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    engine LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    event_index UInt32,
    position UInt32,
    event Enum8('stored' = 1, 'removed' = 2, 'cleared' = 3),
    block_hash UInt64,
    parent_hash UInt64,
    block_size UInt32,
    tokens UInt32,
    medium LowCardinality(String),
    medium_raw LowCardinality(String),
    lora_name LowCardinality(String),
    group_idx Int32,
    _topic LowCardinality(String),
    _partition UInt32,
    _offset UInt64,
    INDEX block_hash_bf block_hash TYPE bloom_filter(0.01) GRANULARITY 4,
    PROJECTION kafka_state
    (
        SELECT _topic, _partition, instance, dp_rank, epoch, max(_offset), max(seq)
        GROUP BY _topic, _partition, instance, dp_rank, epoch
    )
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, epoch, seq, event_index, position)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS engine_stats
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    engine LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    capacity_blocks UInt64,
    block_size UInt32,
    usage Float64,
    running UInt32,
    waiting UInt32,
    prefix_queries UInt64,
    prefix_hits UInt64,
    preemptions UInt64,
    interval_s Float64,
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
ORDER BY (instance, dp_rank, ts, epoch, seq)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS requests
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
    cached_tokens UInt32,
    output_tokens UInt32,
    ttft_s Float64,
    queue_s Float64,
    prefill_s Float64,
    decode_s Float64,
    e2e_s Float64,
    finish_reason LowCardinality(String),
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
ORDER BY (instance, dp_rank, ts, epoch, seq)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_transfers
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
    src_instance LowCardinality(String),
    dst_instance LowCardinality(String),
    backend LowCardinality(String),
    bytes UInt64,
    blocks UInt32,
    chunks UInt32,
    start_ts DateTime64(6, 'UTC'),
    end_ts DateTime64(6, 'UTC'),
    latency_s Float64,
    status LowCardinality(String),
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
ORDER BY (src_instance, dst_instance, ts, instance, epoch, seq)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS stream_gaps
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    engine LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    stream LowCardinality(String),
    first_seq UInt64,
    last_seq UInt64,
    reason LowCardinality(String),
    detected_by LowCardinality(String),
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
ORDER BY (instance, dp_rank, stream, epoch, first_seq)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ingest_errors
(
    _topic LowCardinality(String),
    _partition UInt32,
    _offset UInt64,
    key String,
    value String,
    value_size UInt64,
    reason String,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (_topic, _partition, _offset)
SETTINGS non_replicated_deduplication_window = 10000;

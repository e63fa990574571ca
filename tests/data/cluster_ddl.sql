CREATE TABLE IF NOT EXISTS kvscope_migrations ON CLUSTER kvscope_cluster
(version UInt32, name String, checksum String, applied_at DateTime64(3) DEFAULT now64(3))
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY version;

CREATE TABLE IF NOT EXISTS kv_block_events_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, epoch, seq, event_index, position)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_events ON CLUSTER kvscope_cluster AS kv_block_events_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_events_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS engine_stats_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, ts, epoch, seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS engine_stats ON CLUSTER kvscope_cluster AS engine_stats_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), engine_stats_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS requests_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, ts, epoch, seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS requests ON CLUSTER kvscope_cluster AS requests_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), requests_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_transfers_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (src_instance, dst_instance, ts, instance, epoch, seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_transfers ON CLUSTER kvscope_cluster AS kv_transfers_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_transfers_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS stream_gaps_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY (instance, dp_rank, stream, epoch, first_seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS stream_gaps ON CLUSTER kvscope_cluster AS stream_gaps_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), stream_gaps_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS ingest_errors_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY (_topic, _partition, _offset)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ingest_errors ON CLUSTER kvscope_cluster AS ingest_errors_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), ingest_errors_local, cityHash64(_topic, _partition));

CREATE TABLE IF NOT EXISTS kv_transfer_latency_1m_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (src_instance, dst_instance, backend, minute)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_transfer_latency_1m ON CLUSTER kvscope_cluster AS kv_transfer_latency_1m_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_transfer_latency_1m_local, cityHash64(src_instance, dst_instance));

CREATE MATERIALIZED VIEW IF NOT EXISTS kv_transfer_latency_1m_mv ON CLUSTER kvscope_cluster TO kv_transfer_latency_1m_local AS
SELECT
    toStartOfMinute(ts) AS minute,
    src_instance,
    dst_instance,
    backend,
    toUInt64(count()) AS transfers,
    toUInt64(sum(bytes)) AS bytes,
    quantilesTDigestState(0.5, 0.9, 0.99)(latency_s) AS latency,
    max(latency_s) AS max_latency
FROM kv_transfers_local
GROUP BY minute, src_instance, dst_instance, backend;

CREATE TABLE IF NOT EXISTS kv_block_events_1m_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(minute)
ORDER BY (instance, dp_rank, model, medium, minute)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_events_1m ON CLUSTER kvscope_cluster AS kv_block_events_1m_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_events_1m_local, cityHash64(instance, dp_rank));

CREATE MATERIALIZED VIEW IF NOT EXISTS kv_block_events_1m_mv ON CLUSTER kvscope_cluster TO kv_block_events_1m_local AS
SELECT
    toStartOfMinute(ts) AS minute,
    instance,
    dp_rank,
    model,
    medium,
    toUInt64(countIf(event = 'stored')) AS stores,
    toUInt64(countIf(event = 'removed')) AS removals,
    toUInt64(countIf(event = 'cleared')) AS clears
FROM kv_block_events_local
GROUP BY minute, instance, dp_rank, model, medium;

CREATE TABLE IF NOT EXISTS kv_block_intervals_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(end_ts)
ORDER BY (toStartOfHour(end_ts), instance, dp_rank, epoch, medium, block_hash)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_intervals ON CLUSTER kvscope_cluster AS kv_block_intervals_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_intervals_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_block_open_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', version, is_deleted)
ORDER BY (instance, dp_rank, epoch, medium, block_hash)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_open ON CLUSTER kvscope_cluster AS kv_block_open_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_open_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_block_evicted_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', removal_ord)
ORDER BY (instance, dp_rank, epoch, medium, block_hash)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_evicted ON CLUSTER kvscope_cluster AS kv_block_evicted_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_evicted_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_residency_progress_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY (instance, dp_rank, epoch, generation)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_residency_progress ON CLUSTER kvscope_cluster AS kv_residency_progress_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_residency_progress_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_residency_stage_events_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY (instance, dp_rank, epoch, ord);

CREATE TABLE IF NOT EXISTS kv_residency_stage_events ON CLUSTER kvscope_cluster AS kv_residency_stage_events_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_residency_stage_events_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS kv_block_intervals_stage_local ON CLUSTER kvscope_cluster AS kv_block_intervals
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_block_intervals_stage ON CLUSTER kvscope_cluster AS kv_block_intervals_stage_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_intervals_stage_local, rand());

CREATE TABLE IF NOT EXISTS kv_block_open_stage_local ON CLUSTER kvscope_cluster AS kv_block_open
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_block_open_stage ON CLUSTER kvscope_cluster AS kv_block_open_stage_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_open_stage_local, rand());

CREATE TABLE IF NOT EXISTS kv_block_evicted_stage_local ON CLUSTER kvscope_cluster AS kv_block_evicted
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_block_evicted_stage ON CLUSTER kvscope_cluster AS kv_block_evicted_stage_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_evicted_stage_local, rand());

CREATE TABLE IF NOT EXISTS kv_residency_progress_stage_local ON CLUSTER kvscope_cluster AS kv_residency_progress
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_residency_progress_stage ON CLUSTER kvscope_cluster AS kv_residency_progress_stage_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_residency_progress_stage_local, rand());

CREATE TABLE IF NOT EXISTS kv_residency_stage_candidates_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY tuple();

CREATE TABLE IF NOT EXISTS kv_residency_stage_candidates ON CLUSTER kvscope_cluster AS kv_residency_stage_candidates_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_residency_stage_candidates_local, cityHash64(instance, dp_rank));

ALTER TABLE kv_block_events_local ON CLUSTER kvscope_cluster
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

CREATE TABLE IF NOT EXISTS kv_accesses_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, epoch, seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_accesses ON CLUSTER kvscope_cluster AS kv_accesses_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_accesses_local, cityHash64(instance, dp_rank));

CREATE TABLE IF NOT EXISTS ingest_batches_local ON CLUSTER kvscope_cluster
(
    _topic LowCardinality(String),
    _partition UInt32,
    first_offset UInt64,
    next_offset UInt64,
    written_at DateTime64(3, 'UTC')
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', next_offset)
ORDER BY (_topic, _partition)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ingest_batches ON CLUSTER kvscope_cluster AS ingest_batches_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), ingest_batches_local, cityHash64(_topic, _partition));

CREATE TABLE IF NOT EXISTS ingest_inserts_local ON CLUSTER kvscope_cluster
(
    _topic LowCardinality(String),
    _partition UInt32,
    version UInt64,
    inserts String,
    written_at DateTime64(3, 'UTC')
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', version)
ORDER BY (_topic, _partition)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS ingest_inserts ON CLUSTER kvscope_cluster AS ingest_inserts_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), ingest_inserts_local, cityHash64(_topic, _partition));

ALTER TABLE kv_block_events_local ON CLUSTER kvscope_cluster
    MODIFY COLUMN parent_hash CODEC(LZ4),
    MODIFY COLUMN ts CODEC(DoubleDelta, LZ4),
    MODIFY COLUMN seq CODEC(DoubleDelta, LZ4),
    MODIFY COLUMN _offset CODEC(DoubleDelta, LZ4),
    MODIFY COLUMN event_index CODEC(T64, LZ4),
    MODIFY COLUMN position CODEC(T64, LZ4),
    MODIFY COLUMN tokens CODEC(T64, LZ4),
    MODIFY COLUMN block_size CODEC(T64, LZ4),
    MODIFY COLUMN epoch CODEC(LZ4),
    MODIFY COLUMN group_idx CODEC(LZ4);

ALTER TABLE kv_block_intervals_local ON CLUSTER kvscope_cluster
    MODIFY COLUMN block_hash CODEC(LZ4),
    MODIFY COLUMN tokens CODEC(T64, LZ4),
    MODIFY COLUMN start_ts CODEC(Delta, LZ4),
    MODIFY COLUMN end_ts CODEC(Delta, LZ4),
    MODIFY COLUMN refault_distance CODEC(T64, LZ4),
    MODIFY COLUMN store_ord CODEC(T64, LZ4),
    MODIFY COLUMN removal_ord CODEC(T64, LZ4),
    MODIFY COLUMN generation CODEC(T64, LZ4);

ALTER TABLE kv_block_intervals_stage_local ON CLUSTER kvscope_cluster
    MODIFY COLUMN block_hash CODEC(LZ4),
    MODIFY COLUMN tokens CODEC(T64, LZ4),
    MODIFY COLUMN start_ts CODEC(Delta, LZ4),
    MODIFY COLUMN end_ts CODEC(Delta, LZ4),
    MODIFY COLUMN refault_distance CODEC(T64, LZ4),
    MODIFY COLUMN store_ord CODEC(T64, LZ4),
    MODIFY COLUMN removal_ord CODEC(T64, LZ4),
    MODIFY COLUMN generation CODEC(T64, LZ4);

CREATE TABLE IF NOT EXISTS kv_block_intervals_by_hash_local ON CLUSTER kvscope_cluster
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(end_ts)
ORDER BY (toStartOfHour(end_ts), block_hash, group_key, start_ts)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS kv_block_intervals_by_hash ON CLUSTER kvscope_cluster AS kv_block_intervals_by_hash_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), kv_block_intervals_by_hash_local, rand());

TRUNCATE TABLE kv_block_intervals_by_hash_local ON CLUSTER kvscope_cluster;

INSERT INTO kv_block_intervals_by_hash
    (model, block_hash, group_key, source_id, start_ts, end_ts, tokens, generation)
SELECT
    model, block_hash, cityHash64(model, role, medium), cityHash64(instance, dp_rank),
    start_ts, end_ts, tokens, generation
FROM kv_block_intervals
WHERE generation <= (SELECT max(generation) FROM kv_residency_progress);

ALTER TABLE kv_residency_progress_local ON CLUSTER kvscope_cluster ADD PROJECTION IF NOT EXISTS latest
(
    SELECT
        instance, dp_rank, epoch,
        argMax(last_seq, generation), argMax(events, generation),
        argMax(removals, generation), argMax(clears, generation),
        argMax(first_ts, generation), argMax(last_ts, generation),
        min(first_ts), max(last_ts), max(generation)
    GROUP BY instance, dp_rank, epoch
);

ALTER TABLE kv_residency_progress_local ON CLUSTER kvscope_cluster MATERIALIZE PROJECTION latest SETTINGS mutations_sync = 1;

ALTER TABLE kv_accesses_local ON CLUSTER kvscope_cluster ADD COLUMN IF NOT EXISTS session String DEFAULT '' AFTER held_until_free;

ALTER TABLE kv_accesses ON CLUSTER kvscope_cluster ADD COLUMN IF NOT EXISTS session String DEFAULT '' AFTER held_until_free;

CREATE TABLE IF NOT EXISTS engine_histograms_local ON CLUSTER kvscope_cluster
(
    instance LowCardinality(String),
    dp_rank UInt16,
    model LowCardinality(String),
    role LowCardinality(String),
    engine LowCardinality(String),
    epoch UInt64,
    seq UInt64,
    ts DateTime64(6, 'UTC'),
    metric LowCardinality(String),
    kind LowCardinality(String),
    labels Map(LowCardinality(String), String),
    bounds Array(Float64),
    bucket_deltas Array(UInt64),
    sum_delta Float64,
    count_delta UInt64,
    value Float64,
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, metric, ts, epoch, seq)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS engine_histograms ON CLUSTER kvscope_cluster AS engine_histograms_local
ENGINE = Distributed(kvscope_cluster, currentDatabase(), engine_histograms_local, cityHash64(instance, dp_rank));


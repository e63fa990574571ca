-- kvscope migration 100: engine_histograms, the raw table of stream engine-histograms.
--
-- One row per EngineMetric record: one Prometheus series of an unmodified engine over one
-- scrape interval, as scraped by `kvscope bridge --metrics-url`. Histograms keep their
-- finite bucket bounds and per-bucket deltas (the last delta is the +Inf bucket); counters
-- and gauges use `value`. Same source columns, Kafka position, partitioning, dedup window
-- and kafka_state projection as the other raw tables (see 001_raw_tables.sql).

CREATE TABLE IF NOT EXISTS engine_histograms
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
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (instance, dp_rank, metric, ts, epoch, seq)
SETTINGS non_replicated_deduplication_window = 10000;

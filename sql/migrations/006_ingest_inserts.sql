-- kvscope migration 006: ingest_inserts, the collector's journal of inserts that feed views.
--
-- An insert into kv_block_events or kv_transfers lands in two parts: the raw table's, then
-- its materialized view's. They are committed one after the other, so a collector killed
-- in between leaves raw rows whose aggregate never lands, and the collector resumes after
-- them. Before such inserts the collector writes here, per Kafka partition of the flush,
-- the flush's inserts into those tables (table, deduplication token, day, row count and
-- every Kafka partition's offset range, as JSON) with an even version; once the flush is
-- stored, the odd version (done) goes with the next flush's journal insert. On assignment, a partition whose latest row is not
-- done has its flush repeated from the raw rows with the same tokens: the raw table drops
-- them as duplicates, the views insert what they miss and drop what they have. One row
-- per Kafka partition survives merges (the latest version).

CREATE TABLE IF NOT EXISTS ingest_inserts
(
    _topic LowCardinality(String),
    _partition UInt32,
    version UInt64,
    inserts String,
    written_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (_topic, _partition)
SETTINGS non_replicated_deduplication_window = 10000;

-- kvscope migration 005: ingest_batches, the collector's note of a batch stored out of offset order.
--
-- Stored records normally form a prefix of each Kafka partition, so the collector resumes
-- after the largest stored _offset. A batch whose records alternate between tables or days
-- is stored with one insert per (table, day) instead of one per run of records, which is
-- not a prefix until its last insert lands. Before such a batch's first insert the
-- collector records its offset range here; on assignment, when the stored prefix ends
-- inside the latest recorded range, it re-reads the range and skips the records already
-- stored. One row per Kafka partition survives merges (the latest range).

CREATE TABLE IF NOT EXISTS ingest_batches
(
    _topic LowCardinality(String),
    _partition UInt32,
    first_offset UInt64,
    next_offset UInt64,
    written_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(next_offset)
ORDER BY (_topic, _partition)
SETTINGS non_replicated_deduplication_window = 10000;

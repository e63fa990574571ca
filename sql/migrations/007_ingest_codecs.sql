-- kvscope migration 007: cheaper codecs on kv_block_events (new parts; old parts as they merge).
--
-- Every insert compresses every column of its rows, so the codecs are part of the
-- collector's CPU per block event. Migration 003's ZSTD(1) stage cost more CPU than it
-- saved bytes on these columns (measured on the collector's rows: LZ4 after DoubleDelta
-- and T64 costs ~0.5 byte more per block event, docs/benchmarks.md "Collector throughput").
-- block_hash keeps LZ4: on simulated fleets re-stored hashes repeat, and NONE was larger.
ALTER TABLE kv_block_events
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

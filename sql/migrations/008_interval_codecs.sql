-- kvscope migration 008: cheaper codecs on kv_block_intervals (new parts; old parts as they merge).
--
-- Every interval query reads this table, and every derivation step writes it through its
-- stage table, so its codecs cost CPU on both sides. ZSTD(1) and DoubleDelta (migration
-- 003) saved ~2.5 bytes per interval (~1.2 per block event) and cost more to decode than
-- anything else in a one-hour read: with LZ4, and Delta on the two timestamps, one hour of
-- 100M block events reads its intervals in half the CPU and residency, refaults and the
-- residency histogram run 18-25% faster (docs/benchmarks.md, "Interval codecs").
ALTER TABLE kv_block_intervals
    MODIFY COLUMN block_hash CODEC(LZ4),
    MODIFY COLUMN tokens CODEC(T64, LZ4),
    MODIFY COLUMN start_ts CODEC(Delta, LZ4),
    MODIFY COLUMN end_ts CODEC(Delta, LZ4),
    MODIFY COLUMN refault_distance CODEC(T64, LZ4),
    MODIFY COLUMN store_ord CODEC(T64, LZ4),
    MODIFY COLUMN removal_ord CODEC(T64, LZ4),
    MODIFY COLUMN generation CODEC(T64, LZ4);

ALTER TABLE kv_block_intervals_stage
    MODIFY COLUMN block_hash CODEC(LZ4),
    MODIFY COLUMN tokens CODEC(T64, LZ4),
    MODIFY COLUMN start_ts CODEC(Delta, LZ4),
    MODIFY COLUMN end_ts CODEC(Delta, LZ4),
    MODIFY COLUMN refault_distance CODEC(T64, LZ4),
    MODIFY COLUMN store_ord CODEC(T64, LZ4),
    MODIFY COLUMN removal_ord CODEC(T64, LZ4),
    MODIFY COLUMN generation CODEC(T64, LZ4);

-- Publish a complete stage (one statement per derived table, progress last: the commit).
-- Each runs with a deduplication token of its generation, so finishing an interrupted publish never doubles rows.
INSERT INTO kv_block_intervals SELECT * FROM kv_block_intervals_stage
ORDER BY end_ts, instance, dp_rank, epoch, medium, block_hash, store_ord;
INSERT INTO kv_block_open SELECT * FROM kv_block_open_stage
ORDER BY instance, dp_rank, epoch, medium, block_hash, version;
INSERT INTO kv_block_evicted SELECT * FROM kv_block_evicted_stage
ORDER BY instance, dp_rank, epoch, medium, block_hash;
INSERT INTO kv_residency_progress SELECT * FROM kv_residency_progress_stage
ORDER BY instance, dp_rank, epoch;

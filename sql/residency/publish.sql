-- Publish a complete stage (one statement per derived table, progress last: the commit).
-- Each runs with a deduplication token of its generation and squashes the stage into one block (PUBLISH_SETTINGS), so finishing an interrupted publish never doubles rows.
INSERT INTO kv_block_intervals SELECT * FROM kv_block_intervals_stage;
-- The open stage holds one row per key (stage_open leaves out the tombstones a new row replaces), so its on-insert merge is skipped too.
INSERT INTO kv_block_open SELECT * FROM kv_block_open_stage SETTINGS optimize_on_insert = 0;
-- The evicted stage holds one row per key (stage_evicted groups by it), so merging it on insert would change nothing: skipped.
INSERT INTO kv_block_evicted SELECT * FROM kv_block_evicted_stage SETTINGS optimize_on_insert = 0;
-- The same closed intervals in block-hash order, keyed as routing_opportunity sorts them (migration 009).
INSERT INTO kv_block_intervals_by_hash (model, block_hash, group_key, source_id, start_ts, end_ts, tokens, generation)
SELECT model, block_hash, cityHash64(model, role, medium), cityHash64(instance, dp_rank), start_ts, end_ts, tokens, generation
FROM kv_block_intervals_stage;
INSERT INTO kv_residency_progress SELECT * FROM kv_residency_progress_stage;

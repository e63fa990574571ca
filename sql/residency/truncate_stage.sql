-- Empty the stage tables (before staging a generation and after publishing it).
TRUNCATE TABLE kv_residency_stage_events;
TRUNCATE TABLE kv_residency_stage_candidates;
TRUNCATE TABLE kv_block_intervals_stage;
TRUNCATE TABLE kv_block_open_stage;
TRUNCATE TABLE kv_block_evicted_stage;
TRUNCATE TABLE kv_residency_progress_stage;

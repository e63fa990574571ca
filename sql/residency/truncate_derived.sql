-- Empty the derived tables (a rebuild starts from the raw events again).
TRUNCATE TABLE kv_block_intervals;
TRUNCATE TABLE kv_block_open;
TRUNCATE TABLE kv_block_evicted;
TRUNCATE TABLE kv_residency_progress;

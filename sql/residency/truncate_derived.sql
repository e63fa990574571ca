-- Empty the derived tables (a rebuild starts from the raw events again).
-- Progress goes first: a crash part way leaves nothing committed, and the next refresh,
-- finding nothing committed, empties the rest before it derives (no committed generation
-- can point at a half-emptied table).
TRUNCATE TABLE kv_residency_progress;
TRUNCATE TABLE kv_block_intervals;
TRUNCATE TABLE kv_block_intervals_by_hash;
TRUNCATE TABLE kv_block_open;
TRUNCATE TABLE kv_block_evicted;

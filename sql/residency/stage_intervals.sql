-- Stage the intervals the increment closes: stores closed inside it and committed open intervals it ends.
INSERT INTO kv_block_intervals_stage
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_ts,
       toString(end_kind), refault, refault_distance, store_ord, removal_ord, {generation:UInt64}
FROM kv_residency_stage_candidates
WHERE end_kind != 'open'

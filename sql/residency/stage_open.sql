-- Stage the open-interval changes: new open intervals (version 2*ord+1) and tombstones of the committed ones the increment ends (version 2*ord of the ending event).
INSERT INTO kv_block_open_stage
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, refault,
       refault_distance, store_ord, removal_ord, clear_gen,
       if(prior = 1, 2 * end_ord, 2 * store_ord + 1), prior, {generation:UInt64}
FROM kv_residency_stage_candidates
WHERE prior = 1 OR end_kind = 'open'

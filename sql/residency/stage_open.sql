-- Stage the open-interval changes: new open intervals (version 2*ord+1) and tombstones of the committed ones the increment ends (version 2*ord of the ending event).
INSERT INTO kv_block_open_stage
WITH
-- include: chain
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, refault,
       refault_distance, store_ord, removal_ord, clear_gen, 2 * store_ord + 1, 0,
       {generation:UInt64}
FROM stores
WHERE end_kind = 'open'
UNION ALL
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, refault,
       refault_distance, store_ord, removal_ord, 0, 2 * end_ord, 1, {generation:UInt64}
FROM prior_closed

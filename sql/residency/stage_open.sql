-- Stage the open-interval changes: new open intervals (version 2*ord+1) and tombstones of the committed ones the increment ends (version 2*ord of the ending event).
-- A tombstone whose key also opens a new interval here is left out (the exact set holds only new keys that are, by a 64-bit hash, also tombstones' keys: a collision adds a key no tombstone has): the new row has the higher version (its store is at or after the ending event), so this is the row the table's on-insert merge would keep; the publish then skips that merge (optimize_on_insert = 0) and stores the same rows.
INSERT INTO kv_block_open_stage
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, refault,
       refault_distance, store_ord, removal_ord, clear_gen,
       if(prior = 1, 2 * end_ord, 2 * store_ord + 1), prior, {generation:UInt64}
FROM kv_residency_stage_candidates
WHERE (prior = 0 AND end_kind = 'open')
   OR (prior = 1 AND (instance, dp_rank, epoch, medium, block_hash) NOT IN
        (SELECT instance, dp_rank, epoch, medium, block_hash
         FROM kv_residency_stage_candidates
         WHERE prior = 0 AND end_kind = 'open'
           AND cityHash64(instance, dp_rank, epoch, medium, block_hash) IN
            (SELECT cityHash64(instance, dp_rank, epoch, medium, block_hash)
             FROM kv_residency_stage_candidates WHERE prior = 1)))

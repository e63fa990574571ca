-- Stage the intervals the increment closes: stores closed inside it and committed open intervals it ends.
INSERT INTO kv_block_intervals_stage
WITH
-- include: chain
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_ts,
       end_kind, refault, refault_distance, store_ord, removal_ord, {generation:UInt64}
FROM stores
WHERE end_kind != 'open'
UNION ALL
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_ts,
       end_kind, refault, refault_distance, store_ord, removal_ord, {generation:UInt64}
FROM prior_closed

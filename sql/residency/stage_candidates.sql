-- Stage every interval the increment touches: its stores (open or closed inside it, prior = 0) and the committed open intervals it ends (prior = 1, end_ord = the ending event).
INSERT INTO kv_residency_stage_candidates
WITH
-- include: chain
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_ts,
       end_kind, refault, refault_distance, store_ord, removal_ord, clear_gen,
       toUInt64(0) AS end_ord, toUInt8(0) AS prior
FROM stores
UNION ALL
SELECT instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_ts,
       end_kind, refault, refault_distance, store_ord, removal_ord,
       toUInt64(0) AS clear_gen, end_ord, toUInt8(1) AS prior
FROM prior_closed

-- Stage each hash's last BlockRemoved in the increment (what a later store's refault test looks up).
INSERT INTO kv_block_evicted_stage
SELECT instance, dp_rank, epoch, medium, block_hash, max(ord), argMax(removals_so_far, ord),
       argMax(clear_gen, ord), {generation:UInt64}
FROM kv_residency_stage_events
WHERE event = 'removed'
GROUP BY instance, dp_rank, epoch, medium, block_hash

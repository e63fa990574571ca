-- Stage the planned sources' new block events with their stream positions carried on from the committed progress.
-- ord: position in the source's stream (row number since the epoch began); clear_gen and
-- removals_so_far: running counts of AllBlocksCleared and BlockRemoved rows, current row
-- included: the same running values the window-function definition computes over all rows.
-- `/* sources */` is replaced by one bound condition per planned source and seq range.
-- The committed progress is read from its `latest` projection (migration 010).
INSERT INTO kv_residency_stage_events
SELECT
    e.instance, e.dp_rank, e.model, e.role, e.epoch, e.seq, e.ts, e.event, e.medium, e.block_hash,
    e.tokens,
    b.events + row_number() OVER source_order AS ord,
    b.clears + sum(toUInt64(e.event = 'cleared')) OVER source_order AS clear_gen,
    b.removals + sum(toUInt64(e.event = 'removed')) OVER source_order AS removals_so_far
FROM
(
    SELECT instance, dp_rank, model, role, epoch, seq, event_index, position, ts, event, medium,
           block_hash, tokens
    FROM kv_block_events
    WHERE /* sources */
) AS e
LEFT JOIN
(
    SELECT instance, dp_rank, epoch, argMax(events, generation) AS events,
           argMax(removals, generation) AS removals, argMax(clears, generation) AS clears
    FROM kv_residency_progress
    GROUP BY instance, dp_rank, epoch
) AS b ON b.instance = e.instance AND b.dp_rank = e.dp_rank AND b.epoch = e.epoch
WINDOW source_order AS (
    PARTITION BY e.instance, e.dp_rank, e.epoch ORDER BY e.seq, e.event_index, e.position
    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)

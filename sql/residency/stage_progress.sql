-- Stage the new progress of every source in the increment (inserted last: marks the stage complete).
INSERT INTO kv_residency_progress_stage
SELECT
    e.instance, e.dp_rank, e.epoch, max(e.seq), max(e.ord), max(e.removals_so_far),
    max(e.clear_gen), if(any(b.known) = 1, any(b.first_ts), min(e.ts)), max(e.ts),
    {generation:UInt64}
FROM kv_residency_stage_events AS e
LEFT JOIN
(
    SELECT instance, dp_rank, epoch, argMax(first_ts, generation) AS first_ts, 1 AS known
    FROM kv_residency_progress
    WHERE generation <= {committed:UInt64}
    GROUP BY instance, dp_rank, epoch
) AS b ON b.instance = e.instance AND b.dp_rank = e.dp_rank AND b.epoch = e.epoch
GROUP BY e.instance, e.dp_rank, e.epoch

-- Stage the new progress of every source in the increment (inserted last: marks the stage complete).
-- Aggregated per source first, then joined with the committed progress (one row per source, not per event).
-- first_ts and last_ts are the earliest and latest ts of every event derived so far (a clock
-- that steps back can put an earlier one in a later increment), so they do not depend on how
-- the events were cut into increments: a rebuild gives the same.
-- The committed progress is read from its `latest` projection (migration 010).
INSERT INTO kv_residency_progress_stage
SELECT
    e.instance, e.dp_rank, e.epoch, e.last_seq, e.events, e.removals, e.clears,
    if(b.known = 1, least(b.first_ts, e.first_ts), e.first_ts),
    if(b.known = 1, greatest(b.last_ts, e.last_ts), e.last_ts), {generation:UInt64}
FROM
(
    SELECT instance, dp_rank, epoch, max(seq) AS last_seq, max(ord) AS events,
           max(removals_so_far) AS removals, max(clear_gen) AS clears, min(ts) AS first_ts,
           max(ts) AS last_ts
    FROM kv_residency_stage_events
    GROUP BY instance, dp_rank, epoch
) AS e
LEFT JOIN
(
    SELECT instance, dp_rank, epoch, argMax(first_ts, generation) AS first_ts,
           argMax(last_ts, generation) AS last_ts, 1 AS known
    FROM kv_residency_progress
    GROUP BY instance, dp_rank, epoch
) AS b ON b.instance = e.instance AND b.dp_rank = e.dp_rank AND b.epoch = e.epoch

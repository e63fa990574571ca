-- Residency of KV blocks per source: how long blocks stay cached (closed intervals) and how many are still resident at `until` (censored).
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Durations in seconds; quantiles are t-digest estimates over closed intervals (ended by removal,
-- clear or a duplicate store); still-resident ages are censored at `until`. Blocks still
-- resident when a restart ended their epoch (`_epoch_restarts.sql`) count as closed and as
-- ended_by_restart, but not in the quantiles: when the old engine stopped is known only to
-- lie between its last event and the next epoch's first.
WITH
-- include: block_intervals
SELECT
    instance,
    dp_rank,
    medium,
    count() AS intervals,
    countIf(end_kind != 'open') AS closed,
    countIf(end_kind = 'removed') AS ended_by_removal,
    countIf(end_kind = 'cleared') AS ended_by_clear,
    countIf(end_kind = 'open') AS still_resident,
    quantilesTDigestIf(0.5, 0.9, 0.99)(dur, end_kind NOT IN ('open', 'restarted'))[1] AS p50_s,
    quantilesTDigestIf(0.5, 0.9, 0.99)(dur, end_kind NOT IN ('open', 'restarted'))[2] AS p90_s,
    quantilesTDigestIf(0.5, 0.9, 0.99)(dur, end_kind NOT IN ('open', 'restarted'))[3] AS p99_s,
    maxIfOrNull(dur, end_kind NOT IN ('open', 'restarted')) AS max_s,
    quantileTDigestIf(0.5)(dur, end_kind = 'open') AS still_resident_age_p50_s,
    countIf(end_kind = 'restarted') AS ended_by_restart
FROM
(
    SELECT *, toFloat64(dateDiff('microsecond', start_ts, end_ts)) / 1e6 AS dur
    FROM block_intervals
    WHERE {instance:String} = '' OR instance = {instance:String}
)
GROUP BY instance, dp_rank, medium
ORDER BY instance, dp_rank, medium

-- Eviction churn per source: stores, removals, clears, removals per second and churn ratio (removals / stores) over the range.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- All media together (clears have none). Reads the per-minute aggregate kv_block_events_1m: the range is rounded to whole minutes and
-- the rate divides by the minutes between the source's first and last active minute (inclusive).
SELECT
    instance,
    dp_rank,
    model,
    sum(stores) AS stores,
    sum(removals) AS removals,
    sum(clears) AS clears,
    removals / (dateDiff('second', min(minute), max(minute)) + 60) AS removals_per_s,
    if(stores = 0, NULL, removals / stores) AS churn_ratio
FROM kv_block_events_1m
WHERE minute >= toStartOfMinute({since:DateTime64(6)}) AND minute < {until:DateTime64(6)}
  AND ({instance:String} = '' OR instance = {instance:String})
  AND ({model:String} = '' OR model = {model:String})
GROUP BY instance, dp_rank, model
ORDER BY instance, dp_rank, model

-- Eviction churn over time: stores, removals, clears, removals per second and churn ratio per source and time bucket.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); bucket_s (UInt32, seconds, a multiple of 60).
-- All media together (clears have none). Reads the per-minute aggregate kv_block_events_1m (minute resolution).
SELECT
    instance,
    dp_rank,
    toStartOfInterval(minute, toIntervalSecond({bucket_s:UInt32})) AS bucket,
    sum(stores) AS stores,
    sum(removals) AS removals,
    sum(clears) AS clears,
    removals / {bucket_s:UInt32} AS removals_per_s,
    if(stores = 0, NULL, removals / stores) AS churn_ratio
FROM kv_block_events_1m
WHERE minute >= toStartOfMinute({since:DateTime64(6)}) AND minute < {until:DateTime64(6)}
  AND ({instance:String} = '' OR instance = {instance:String})
  AND ({model:String} = '' OR model = {model:String})
GROUP BY instance, dp_rank, bucket
ORDER BY instance, dp_rank, bucket

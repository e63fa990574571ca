-- Engine histogram buckets scraped from unmodified engines: per instance, histogram metric, labels, time bucket and le: observations in that bucket.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); bucket_s (UInt32 seconds).
-- One row per non-empty bucket (le = +inf for the last one): the raw distribution, for plots
-- or for a consumer that wants its own quantile estimate.
SELECT
    instance,
    metric,
    labels,
    toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})) AS bucket,
    le,
    sum(n) AS observations
FROM engine_histograms
ARRAY JOIN bucket_deltas AS n, arrayPushBack(bounds, inf) AS le
WHERE kind = 'histogram'
  AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({instance:String} = '' OR instance = {instance:String})
  AND ({model:String} = '' OR model = {model:String})
GROUP BY instance, metric, labels, bucket, le
HAVING observations > 0
ORDER BY instance, metric, labels, bucket, le

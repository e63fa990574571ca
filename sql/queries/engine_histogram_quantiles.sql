-- Engine-side latency distributions scraped from unmodified engines: per instance, histogram metric, labels and time bucket: observations, mean, p50/p90/p99, max bucket.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); bucket_s (UInt32 seconds).
-- Reads engine_histograms (kvscope bridge --metrics-url): per-bucket deltas are summed over
-- the time bucket, then quantiles are interpolated linearly inside the bucket that holds
-- them, as Prometheus' histogram_quantile does (0 is the lower edge of the first bucket;
-- a quantile in the +Inf bucket reports the largest finite bound). Units are the metric's
-- own (vllm:nixl_xfer_time_seconds: seconds, sglang:kv_transfer_latency_ms: ms).
WITH merged AS
(
    SELECT
        instance,
        metric,
        labels,
        bounds,
        toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})) AS bucket,
        sumForEach(bucket_deltas) AS counts,
        sum(count_delta) AS observations,
        sum(sum_delta) AS total
    FROM engine_histograms
    WHERE kind = 'histogram'
      AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY instance, metric, labels, bounds, bucket
    HAVING observations > 0
)
SELECT
    instance,
    metric,
    labels,
    bucket,
    observations,
    total / observations AS mean,
    arrayMap(
        q -> (
            arrayFirstIndex(c -> c >= q * observations, arrayCumSum(counts)) AS i,
            if(i = 1, 0., bounds[i - 1]) AS lower,
            if(i <= length(bounds), bounds[i], bounds[length(bounds)]) AS upper,
            if(i = 1, 0, arrayCumSum(counts)[i - 1]) AS before,
            lower + (upper - lower) * (q * observations - before) / counts[i]
        ).5,
        [0.5, 0.9, 0.99]
    ) AS p,
    p[1] AS p50,
    p[2] AS p90,
    p[3] AS p99,
    if(counts[length(counts)] > 0, inf, bounds[arrayLastIndex(c -> c > 0, counts)]) AS max_bound
FROM merged
ORDER BY instance, metric, labels, bucket

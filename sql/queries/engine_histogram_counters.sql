-- Engine counters and gauges scraped from unmodified engines (prefix cache, PD queues): per instance, metric, labels and time bucket: counter increase and rate, gauge mean and max.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); bucket_s (UInt32 seconds).
-- Counters: `increase` is the sum of scrape deltas (e.g. vllm:prefix_cache_hits / _queries
-- give the token hit rate); gauges: mean and max of the scraped values (SGLang PD queues).
SELECT
    instance,
    metric,
    kind,
    labels,
    toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})) AS bucket,
    if(kind = 'counter', sum(value), NULL) AS increase,
    if(kind = 'counter', sum(value) / nullIf(sum(interval_s), 0), NULL) AS per_second,
    if(kind = 'gauge', avg(value), NULL) AS gauge_mean,
    if(kind = 'gauge', max(value), NULL) AS gauge_max,
    count() AS scrapes
FROM engine_histograms
WHERE kind IN ('counter', 'gauge')
  AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({instance:String} = '' OR instance = {instance:String})
  AND ({model:String} = '' OR model = {model:String})
GROUP BY instance, metric, kind, labels, bucket
ORDER BY instance, metric, labels, bucket

-- Report: KV-cache usage (0..1, share of blocks in use) per instance and time bucket.
-- Parameters: since, until (DateTime64(6)), model ('' = all), bucket_s (UInt32 seconds).
SELECT
    instance,
    toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})) AS t,
    avg(usage) AS usage
FROM engine_stats
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
GROUP BY instance, t
ORDER BY instance, t

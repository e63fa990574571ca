-- KV-transfer latency per (src, dst) pair and time bucket: count, p50/p90/p99/max in ms, bytes and GB/s.
-- Parameters: since, until (DateTime64(6)); instance (String, matches src or dst, '' = all); bucket_s (UInt32 seconds, a multiple of 60).
-- Reads the per-minute aggregate kv_transfer_latency_1m: quantiles are merged t-digests.
-- gbps_p50 = mean bytes per transfer / p50 latency (the aggregate keeps no latency sum).
SELECT
    src_instance,
    dst_instance,
    backend,
    toStartOfInterval(minute, toIntervalSecond({bucket_s:UInt32})) AS bucket,
    sum(transfers) AS transfers,
    quantilesTDigestMerge(0.5, 0.9, 0.99)(latency)[1] * 1000 AS p50_ms,
    quantilesTDigestMerge(0.5, 0.9, 0.99)(latency)[2] * 1000 AS p90_ms,
    quantilesTDigestMerge(0.5, 0.9, 0.99)(latency)[3] * 1000 AS p99_ms,
    max(max_latency) * 1000 AS max_ms,
    sum(bytes) AS bytes,
    if(p50_ms > 0, bytes / transfers / (p50_ms / 1000) / 1e9, NULL) AS gbps_p50
FROM kv_transfer_latency_1m
WHERE minute >= toStartOfMinute({since:DateTime64(6)}) AND minute < {until:DateTime64(6)}
  AND ({instance:String} = '' OR src_instance = {instance:String} OR dst_instance = {instance:String})
GROUP BY src_instance, dst_instance, backend, bucket
ORDER BY src_instance, dst_instance, backend, bucket

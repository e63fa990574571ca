-- Report: KV transfers slower than an SLO, per prefill -> decode pair.
-- Parameters: since, until (DateTime64(6)), model ('' = all), slo_ms (Float64 milliseconds).
SELECT
    src_instance,
    dst_instance,
    count() AS transfers,
    countIf(latency_s * 1000 > {slo_ms:Float64}) AS breaches
FROM kv_transfers
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
GROUP BY src_instance, dst_instance
ORDER BY breaches DESC, src_instance, dst_instance

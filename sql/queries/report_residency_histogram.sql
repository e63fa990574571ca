-- Report: histogram of how long blocks stayed resident per instance (closed intervals, power-of-two second buckets) and how many are still resident.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Intervals come from the block_intervals fragment (as in `residency`); bucket k holds
-- durations in [2^k, 2^(k+1)) seconds, k clamped to -10..20 (~1 ms .. ~12 days); open
-- (still resident) intervals get a row with lo_s = hi_s = NULL; blocks a restart ended
-- (`residency`'s ended_by_restart) are in neither.
WITH
-- include: block_intervals
SELECT
    instance,
    if(open, NULL, pow(2, k)) AS lo_s,
    if(open, NULL, pow(2, k + 1)) AS hi_s,
    count() AS blocks
FROM
(
    SELECT
        instance,
        end_kind = 'open' AS open,
        if(open, 0, toInt32(greatest(-10, least(20, floor(log2(greatest(
            toFloat64(dateDiff('microsecond', start_ts, end_ts)) / 1e6, 1e-6))))))) AS k
    FROM block_intervals
    WHERE end_kind != 'restarted' AND ({instance:String} = '' OR instance = {instance:String})
)
GROUP BY instance, open, k
ORDER BY instance, open, k

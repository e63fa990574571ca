-- Report: request timings per role (TTFT, prefill time per uncached prompt token) and the KV bytes per block the engines' transfers carried.
-- Parameters: since, until (DateTime64(6), half-open window), model ('' = all models).
-- prefill_s and uncached_tokens sum only requests that report a prefill time (> 0), so
-- prefill_s / uncached_tokens is the measured prefill seconds per token. block_bytes and
-- blocks sum the successful KV transfers of the role's instances (sender side: prefill):
-- block_bytes / blocks is the KV bytes per block the engines moved, the model's shape as
-- the engines report it. Float sums and means are rounded to 1 ns: parallel aggregation
-- adds in no fixed order, and the report must read the same twice.
WITH
timing AS
(
    SELECT role, count() AS n, sum(prompt_tokens) AS prompt_sum,
           sum(cached_tokens) AS cached_sum, countIf(prefill_s > 0) AS timed_requests,
           round(sumIf(prefill_s, prefill_s > 0), 9) AS prefill_sum_s,
           sumIf(prompt_tokens - cached_tokens, prefill_s > 0) AS uncached_tokens,
           round(avg(ttft_s), 9) AS ttft_avg_s, quantileTDigest(0.5)(ttft_s) AS ttft_median_s
    FROM requests
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY role
),
moved AS
(
    SELECT role, sum(bytes) AS bytes_sum, sum(blocks) AS blocks_sum
    FROM kv_transfers
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
      AND status = 'ok' AND blocks > 0 AND bytes > 0
    GROUP BY role
)
SELECT
    if(t.role = '', m.role, t.role) AS role,
    t.n AS requests, t.prompt_sum AS prompt_tokens, t.cached_sum AS cached_tokens,
    t.timed_requests AS timed_requests, t.prefill_sum_s AS prefill_s,
    t.uncached_tokens AS uncached_tokens,
    if(t.n = 0, NULL, t.ttft_avg_s) AS ttft_mean_s,
    if(t.n = 0, NULL, t.ttft_median_s) AS ttft_p50_s,
    m.bytes_sum AS block_bytes, m.blocks_sum AS blocks
FROM timing AS t
FULL OUTER JOIN moved AS m ON m.role = t.role
ORDER BY role

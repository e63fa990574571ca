-- Per-request prefix-cache hit rate: prompt tokens, cached tokens and their ratio for each finished request on each source, newest first.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); limit (UInt32).
-- In prefill/decode disaggregation a request finishes on both sides, so it has one row per side.
SELECT
    ts,
    request_id,
    instance,
    dp_rank,
    role,
    prompt_tokens,
    cached_tokens,
    if(prompt_tokens = 0, NULL, cached_tokens / prompt_tokens) AS hit_rate,
    ttft_s,
    e2e_s
FROM requests
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({instance:String} = '' OR instance = {instance:String})
  AND ({model:String} = '' OR model = {model:String})
ORDER BY ts DESC, request_id, instance
LIMIT {limit:UInt32}

-- Per-session prefix-cache hit rate: for each session (or cache salt) of the access stream, its requests, prompt tokens looked up and tokens hit, busiest first.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); limit (UInt32).
-- One row per non-empty `session` of the BlockAccess rows released in [since, until)
-- (vLLM: the request's session_id, else its cache_salt; the simulator: the chat of a
-- multi-turn workload). A P/D request is counted on its first side only (decode-side
-- lookups are left out). hit_rate = hit tokens / prompt tokens, token-weighted.
SELECT
    session,
    count() AS requests,
    uniqExact(instance, dp_rank) AS sources,
    sum(prompt_tokens) AS prompt_tokens,
    sum(hit_blocks * block_size) AS hit_tokens,
    if(prompt_tokens = 0, NULL, hit_tokens / prompt_tokens) AS hit_rate,
    min(arrival_ts) AS first_arrival,
    max(arrival_ts) AS last_arrival
FROM kv_accesses
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND session != '' AND role != 'decode'
  AND ({model:String} = '' OR model = {model:String})
  AND ({instance:String} = '' OR instance = {instance:String})
GROUP BY session
ORDER BY requests DESC, session
LIMIT {limit:UInt32}

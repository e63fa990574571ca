-- Token-weighted prefix-cache hit rate per source and for the fleet (instance '*'): engine-stats hits / queries, and the same from finished requests.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- hit_rate = sum(prefix_hits) / sum(prefix_queries) from engine_stats; request_hit_rate =
-- sum(cached_tokens) / sum(prompt_tokens) from requests; request_hit_rate_p50 is the median of
-- the per-request ratios (t-digest). role: the source's role ('' on the fleet row). The
-- fleet row sums every source's lookups: in prefill/decode disaggregation a prompt is looked
-- up on both sides, so the fleet hit rate counting each prompt once (the report's and the
-- dashboard's) sums only the rows whose role is not 'decode'.
WITH
stats AS
(
    SELECT instance, dp_rank, any(role) AS role, sum(prefix_queries) AS queries,
           sum(prefix_hits) AS hits
    FROM engine_stats
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY GROUPING SETS ((instance, dp_rank), ())
),
reqs AS
(
    SELECT instance, dp_rank, count() AS requests, sum(prompt_tokens) AS prompt_sum,
           sum(cached_tokens) AS cached_sum,
           quantileTDigest(0.5)(if(prompt_tokens = 0, 0, cached_tokens / prompt_tokens)) AS p50
    FROM requests
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY GROUPING SETS ((instance, dp_rank), ())
)
SELECT
    if(s.instance = '', '*', s.instance) AS instance,
    s.dp_rank AS dp_rank,
    if(s.instance = '', '', s.role) AS role,
    s.queries AS prefix_queries,
    s.hits AS prefix_hits,
    if(s.queries = 0, NULL, s.hits / s.queries) AS hit_rate,
    r.requests AS requests,
    r.prompt_sum AS prompt_tokens,
    r.cached_sum AS cached_tokens,
    if(r.prompt_sum = 0, NULL, r.cached_sum / r.prompt_sum) AS request_hit_rate,
    r.p50 AS request_hit_rate_p50
FROM stats AS s
LEFT JOIN reqs AS r ON r.instance = s.instance AND r.dp_rank = s.dp_rank
ORDER BY instance = '*', instance, dp_rank

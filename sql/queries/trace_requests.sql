-- The access stream as trace requests: per request and source, its arrival, prompt, full prompt-block hashes and output tokens, oldest arrival first.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- One row per BlockAccess released in [since, until). prompt_hashes: the hashes of the
-- prompt's full blocks (the first prompt_tokens / block_size of block_hashes).
-- output_tokens: what the request's RequestFinished (same instance, dp_rank and request
-- id) reports, NULL when the requests stream has no row for it. Read by
-- `kvscope trace export`, which writes these rows as a Mooncake-format trace.
SELECT
    a.instance AS instance, a.dp_rank AS dp_rank, a.role AS role, a.request_id AS request_id,
    a.arrival_ts AS arrival_ts, a.prompt_tokens AS prompt_tokens, a.block_size AS block_size,
    arraySlice(a.block_hashes, 1, intDiv(a.prompt_tokens, greatest(a.block_size, 1))) AS prompt_hashes,
    a.held_blocks AS held_blocks,
    if(r.request_id = '', NULL, r.output_tokens) AS output_tokens
FROM kv_accesses AS a
LEFT JOIN
(
    SELECT instance, dp_rank, request_id, any(output_tokens) AS output_tokens
    FROM requests
    WHERE ts >= {since:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
      AND ({instance:String} = '' OR instance = {instance:String})
    GROUP BY instance, dp_rank, request_id
) AS r ON r.instance = a.instance AND r.dp_rank = a.dp_rank AND r.request_id = a.request_id
WHERE a.ts >= {since:DateTime64(6)} AND a.ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR a.model = {model:String})
  AND ({instance:String} = '' OR a.instance = {instance:String})
ORDER BY a.arrival_ts, a.instance, a.dp_rank, a.request_id

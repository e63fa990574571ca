-- Report: the key figures per time bucket and role (prefix-cache queries and hits, requests, prompt tokens), for trends per day or hour.
-- Parameters: since, until (DateTime64(6), half-open window), model ('' = all models), bucket_s (UInt32 seconds).
-- The fleet's hit rate counting each prompt once sums the roles other than decode.
SELECT
    bucket, role,
    sum(queries) AS prefix_queries, sum(hits) AS prefix_hits,
    sum(finished) AS requests, sum(prompt) AS prompt_tokens
FROM
(
    SELECT toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})) AS bucket, role,
           toUInt64(prefix_queries) AS queries, toUInt64(prefix_hits) AS hits,
           toUInt64(0) AS finished, toUInt64(0) AS prompt
    FROM engine_stats
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT toStartOfInterval(ts, toIntervalSecond({bucket_s:UInt32})), role,
           toUInt64(0), toUInt64(0), toUInt64(1), toUInt64(prompt_tokens)
    FROM requests
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
)
GROUP BY bucket, role
ORDER BY bucket, role

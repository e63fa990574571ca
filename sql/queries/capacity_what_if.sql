-- Capacity what-if: predicted prefix-cache hit rate and prefill tokens saved per source (and fleet) with more KV blocks, from refault distances.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); fractions (Array(Float64), extra capacity as a fraction of each source's capacity).
-- Model (LRU): a cache larger by Δ = floor(capacity_blocks x fraction) blocks would have hit every
-- refault with distance < Δ; saved tokens are those refaults' tokens. Current hits and queries
-- come from engine_stats (token-weighted). The fleet row (instance '*') sums the sources.
WITH
-- include: block_intervals
,
stats AS
(
    SELECT instance, dp_rank, max(capacity_blocks) AS capacity_blocks,
           sum(prefix_queries) AS queries, sum(prefix_hits) AS hits
    FROM engine_stats
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
      AND ({instance:String} = '' OR instance = {instance:String})
    GROUP BY instance, dp_rank
),
distances AS
(
    SELECT instance, dp_rank, groupArray((refault_distance, tokens)) AS refaults
    FROM block_intervals
    WHERE refault = 1 AND ({instance:String} = '' OR instance = {instance:String})
    GROUP BY instance, dp_rank
),
per_source AS
(
    SELECT
        s.instance AS instance, s.dp_rank AS dp_rank, s.capacity_blocks AS cap,
        s.queries AS q, s.hits AS h,
        arrayJoin({fractions:Array(Float64)}) AS fraction,
        toUInt64(floor(s.capacity_blocks * fraction)) AS extra,
        arraySum(arrayMap(r -> if(r.1 < extra, toUInt64(r.2), 0), d.refaults)) AS saved
    FROM stats AS s
    LEFT JOIN distances AS d ON d.instance = s.instance AND d.dp_rank = s.dp_rank
)
SELECT
    if(fleet_row, '*', source_instance) AS instance,
    source_dp_rank AS dp_rank,
    fraction, capacity_blocks, extra_blocks, queries, hits,
    if(queries = 0, NULL, hits / queries) AS hit_rate,
    saved_tokens,
    if(queries = 0, NULL, (hits + saved_tokens) / queries) AS predicted_hit_rate
FROM
(
    SELECT
        instance AS source_instance, dp_rank AS source_dp_rank, fraction,
        grouping(instance) = 1 AS fleet_row,
        sum(cap) AS capacity_blocks, sum(extra) AS extra_blocks, sum(q) AS queries,
        sum(h) AS hits, sum(saved) AS saved_tokens
    FROM per_source
    GROUP BY GROUPING SETS ((instance, dp_rank, fraction), (fraction))
)
ORDER BY instance = '*', instance, dp_rank, fraction

-- Capacity what-if: predicted prefix-cache hit rate and prefill tokens saved per source (and fleet) with more KV blocks: access replay when the access stream exists, else refault distances.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); fractions (Array(Float64), extra capacity as a fraction of each source's capacity).
-- predicted_hit_rate is the best estimate the data allows, `method` says which and
-- `error_pp` its error range in points (docs/analytics.md). This SQL computes the
-- events-only methods and labels rows 'refault-corrected' (predicted_saved_tokens: the
-- prefill tokens the best estimate saves); `run_query` then calls
-- `kvscope.collector.analytics.whatif.refine`, which fills error_pp and, where
-- `kv_accesses` has rows, replaces predicted_hit_rate with the access replay's
-- (saved_tokens_replay). Run outside kvscope, this SQL leaves error_pp NULL.
-- Model (LRU): a cache larger by Δ = floor(capacity_blocks x fraction) blocks would have hit every
-- refault with distance < Δ; saved tokens are those refaults' tokens, predicted_hit_rate =
-- (hits + saved) / queries with hits and queries from engine_stats (token-weighted):
-- predicted_hit_rate_first.
-- *_corrected: one cascade-correction step: each refault's distance minus the refaults saved
-- (first order) whose re-store lies between its removal and its re-store (each of those
-- avoided an eviction), then < Δ again. The fleet row (instance '*') sums the sources.
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
marks AS
(
    SELECT
        cityHash64(b.instance, b.dp_rank) AS source_key,
        cityHash64(b.instance, b.dp_rank, b.epoch) AS stream_key,
        b.store_ord AS id, b.tokens AS tokens, b.refault_distance AS distance,
        arrayMap(f -> toUInt64(floor(s.capacity_blocks * f)), {fractions:Array(Float64)}) AS extras,
        tupleElement(mark, 1) AS pos, tupleElement(mark, 2) AS is_store
    FROM block_intervals AS b
    INNER JOIN stats AS s ON s.instance = b.instance AND s.dp_rank = b.dp_rank
    ARRAY JOIN [(b.removal_ord, toUInt8(0)), (b.store_ord, toUInt8(1))] AS mark
    WHERE b.refault = 1 AND b.carried_in = 0
),
running AS
(
    SELECT
        source_key, stream_key, id, tokens, distance, extras, is_store,
        sumForEach(arrayMap(x -> toUInt64(is_store = 1 AND distance < x), extras)) OVER (
            PARTITION BY stream_key ORDER BY pos
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS saved_so_far
    FROM marks
),
corrected AS
(
    SELECT
        any(source_key) AS source_key, any(tokens) AS refault_tokens,
        any(distance) AS d, any(extras) AS deltas,
        arrayMap(x -> toUInt64(d < x), deltas) AS first,
        arrayMap((at_store, at_removal, f, x) ->
                     toInt64(d) - (toInt64(at_store) - toInt64(f) - toInt64(at_removal)) < toInt64(x),
                 anyIf(saved_so_far, is_store = 1), anyIf(saved_so_far, is_store = 0),
                 first, deltas) AS second
    FROM running
    GROUP BY stream_key, id
),
saved AS
(
    SELECT source_key,
           sumForEach(arrayMap(f -> f * refault_tokens, first)) AS saved_first_tokens,
           sumForEach(arrayMap(f -> toUInt64(f) * refault_tokens, second)) AS saved_corrected_tokens
    FROM corrected
    GROUP BY source_key
),
per_source AS
(
    SELECT
        s.instance AS instance, s.dp_rank AS dp_rank, fraction, s.capacity_blocks AS cap,
        toUInt64(floor(s.capacity_blocks * fraction)) AS extra, s.queries AS q, s.hits AS h,
        if(empty(v.saved_first_tokens), 0, v.saved_first_tokens[k]) AS saved,
        if(empty(v.saved_corrected_tokens), 0, v.saved_corrected_tokens[k]) AS saved_c
    FROM stats AS s
    LEFT JOIN saved AS v ON v.source_key = cityHash64(s.instance, s.dp_rank)
    ARRAY JOIN {fractions:Array(Float64)} AS fraction, arrayEnumerate({fractions:Array(Float64)}) AS k
)
SELECT
    if(fleet_row, '*', source_instance) AS instance,
    source_dp_rank AS dp_rank,
    fraction, capacity_blocks, extra_blocks, queries, hits,
    if(queries = 0, NULL, hits / queries) AS hit_rate,
    if(queries = 0, NULL, (hits + saved_tokens_corrected) / queries) AS predicted_hit_rate,
    toInt64(saved_tokens_corrected) AS predicted_saved_tokens,
    'refault-corrected' AS method,
    CAST(NULL, 'Nullable(Float64)') AS error_pp,
    saved_tokens,
    if(queries = 0, NULL, (hits + saved_tokens) / queries) AS predicted_hit_rate_first,
    saved_tokens_corrected,
    if(queries = 0, NULL, (hits + saved_tokens_corrected) / queries) AS predicted_hit_rate_corrected,
    CAST(NULL, 'Nullable(Int64)') AS saved_tokens_replay
FROM
(
    SELECT
        instance AS source_instance, dp_rank AS source_dp_rank, fraction,
        grouping(instance) = 1 AS fleet_row,
        sum(cap) AS capacity_blocks, sum(extra) AS extra_blocks, sum(q) AS queries,
        sum(h) AS hits, sum(saved) AS saved_tokens, sum(saved_c) AS saved_tokens_corrected
    FROM per_source
    GROUP BY GROUPING SETS ((instance, dp_rank, fraction), (fraction))
)
ORDER BY instance = '*', instance, dp_rank, fraction

-- Capacity what-if: predicted prefix-cache hit rate and prefill tokens saved per source (and fleet) with more KV blocks: access replay when the access stream exists, else refault distances.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all); fractions (Array(Float64), extra capacity as a fraction of each source's capacity).
-- predicted_hit_rate is the best estimate the data allows, `method` says which and
-- `error_pp` its error range in points (docs/analytics.md). This SQL computes the
-- events-only methods and labels rows 'refault-corrected' (predicted_saved_tokens: the
-- prefill tokens the best estimate saves); `run_query` then calls
-- `kvscope.analytics.whatif.refine`, which fills error_pp and, where
-- `kv_accesses` has rows, replaces predicted_hit_rate with the access replay's
-- (saved_tokens_replay). Run outside kvscope, this SQL leaves error_pp NULL.
-- Model (LRU): a cache larger by Δ = floor(capacity_blocks x fraction) blocks would have hit every
-- refault with distance < Δ; saved tokens are those refaults' tokens, predicted_hit_rate =
-- (hits + saved) / queries with hits and queries from engine_stats (token-weighted):
-- predicted_hit_rate_first.
-- *_corrected: one cascade-correction step: each refault's distance minus the refaults saved
-- (first order) whose re-store lies between its removal and its re-store (each of those
-- avoided an eviction), then < Δ again. The fleet row (instance '*') sums the sources.
-- Cost: the refaults of each stream (source, epoch) become arrays in re-store order, and
-- one sort of removals and re-stores together counts, once, the re-stores before each
-- removal. Per fraction: one running count of saved refaults (`arrayCumSum`) in re-store
-- order; a refault's correction is that count at its re-store minus the count at its
-- removal. No window function, no per-refault grouping; each fraction is a row of its own
-- (one copy of the stream's arrays each, not the three that nested lambdas made).
-- Only refaults that the largest extra capacity x_max could save are sorted and copied
-- (a correction never exceeds the refaults saved first order, nor the re-stores between
-- the refault's removal and its re-store, so a refault at least that much above x_max is
-- saved by no fraction and adds no count; 60% of the refaults of an hour of the 100M
-- benchmark, 0.93 -> 0.73 s).
-- The stats join the streams (one row per source epoch), not the refaults: joining every refault
-- cost a third of the query (3.6 -> 2.2 CPU-s for one hour of 100M events, with the sorts below
-- taking their keys as a second array instead of indexing one inside the lambda).
-- Memory: ~50 bytes per refault of the largest stream in the window, plus 24 per refault
-- and fraction (its distances, tokens and counts, copied per fraction).
WITH
-- include: stores_in_window
,
-- include: source_capacity
,
stats AS
(
    -- capacity: never a reported 0 (see the source_capacity fragment)
    SELECT e.instance AS instance, e.dp_rank AS dp_rank,
           any(c.known_capacity) AS capacity_blocks,
           sum(e.prefix_queries) AS queries, sum(e.prefix_hits) AS hits
    FROM engine_stats AS e
    LEFT JOIN source_capacity AS c ON c.instance = e.instance AND c.dp_rank = e.dp_rank
    WHERE e.ts >= {since:DateTime64(6)} AND e.ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR e.model = {model:String})
      AND ({instance:String} = '' OR e.instance = {instance:String})
    GROUP BY e.instance, e.dp_rank
),
refaults AS
(
    SELECT instance, dp_rank, epoch, removal_ord, store_ord, refault_distance, tokens AS refault_tokens
    FROM stores
    WHERE refault = 1 AND ({instance:String} = '' OR instance = {instance:String})
),
collected AS
(
    -- one numeric array per column (an array of tuples costs 3x to collect)
    SELECT instance, dp_rank, epoch,
           groupArray(store_ord) AS stores_all, groupArray(removal_ord) AS removals_all,
           groupArray(refault_distance) AS distances_all, groupArray(refault_tokens) AS tokens_all
    FROM refaults
    GROUP BY instance, dp_rank, epoch
),
bounded AS
(
    -- xs: the extra capacities (blocks) of the stream's source. A refault's corrected
    -- distance is at least its distance minus the refaults saved first order at x_max
    -- (saved_at_most): one at x_max + saved_at_most or above is saved by no x and counts
    -- in no correction, so it is dropped here
    SELECT c.instance AS instance, c.dp_rank AS dp_rank,
           stores_all, removals_all, distances_all, tokens_all,
           arrayMap(f -> toInt64(floor(s.capacity_blocks * f)), {fractions:Array(Float64)}) AS xs,
           arrayMax(xs) AS x_max,
           arrayCount(d -> d < x_max, distances_all) AS saved_at_most,
           arrayMap(d -> d < x_max + saved_at_most, distances_all) AS may_be_saved
    FROM collected AS c INNER JOIN stats AS s ON s.instance = c.instance AND s.dp_rank = c.dp_rank
),
streams AS
(
    SELECT
        instance, dp_rank, xs, x_max,
        arrayFilter((v, keep) -> keep, stores_all, may_be_saved) AS stores_unordered,
        length(stores_unordered) AS n,
        arrayFilter((v, keep) -> keep, removals_all, may_be_saved) AS removals_unordered,
        arrayFilter((v, keep) -> keep, distances_all, may_be_saved) AS distances_unordered,
        arrayFilter((v, keep) -> keep, tokens_all, may_be_saved) AS tokens_unordered,
        -- put in re-store order by one permutation
        arraySort((i, s) -> s, range(1, n + 1), stores_unordered) AS by_store,
        arrayMap(i -> toInt64(distances_unordered[i]), by_store) AS distances,
        arrayMap(i -> tokens_unordered[i], by_store) AS tokens,
        -- marks 1..n removals, n+1..2n re-stores (collected order), in position order
        arraySort((j, p) -> p, range(1, 2 * n + 1),
                  arrayConcat(removals_unordered, stores_unordered)) AS by_pos,
        arrayCumSum(arrayMap(j -> toUInt32(j > n), by_pos)) AS stores_so_far,
        -- the count at each removal, put back in collected order (a sort of the n removal
        -- marks only), then in re-store order like the other arrays
        arraySort((c, j) -> j, arrayFilter((c, j) -> j <= n, stores_so_far, by_pos),
                  arrayFilter(j -> j <= n, by_pos)) AS before_unordered,
        arrayMap(i -> before_unordered[i], by_store) AS stores_before_removal
    FROM bounded
),
saved AS
(
    SELECT instance, dp_rank, k,
           sum(first_tokens) AS saved_first_tokens,
           sum(corrected_tokens) AS saved_corrected_tokens
    FROM
    (
        -- per extra capacity x (one row each, ARRAY JOIN: the arrays are copied once per
        -- fraction; nesting lambdas to name hit and saved_so_far copied them twice more):
        -- hit: 1 where the refault is saved (first order); saved_so_far[i]: refaults saved
        -- among the first i re-stores. The corrected distance of refault i is d - (saved
        -- re-stores between its removal and its re-store) =
        -- d + saved_so_far[stores_before_removal] - (saved_so_far[i] - hit[i]).
        SELECT
            instance, dp_rank, k,
            arrayMap(d -> d < x, kept_distances) AS hit,
            arrayCumSum(hit) AS saved_so_far,
            arraySum((h, t) -> h * t, hit, kept_tokens) AS first_tokens,
            arraySum((d, before, own, t) -> (d + before - own < x) * t,
                kept_distances,
                arrayMap(r -> saved_so_far[r], kept_before),
                arrayMap((c, h) -> c - h, saved_so_far, hit), kept_tokens) AS corrected_tokens
        FROM
        (
            -- the refaults x_max can save now that their re-stores between are known (a
            -- correction is at most those re-stores), their counts renumbered to match
            SELECT instance, dp_rank, xs,
                   arrayFilter((d, keep) -> keep, distances, kept) AS kept_distances,
                   arrayFilter((t, keep) -> keep, tokens, kept) AS kept_tokens,
                   arrayMap(b -> kept_so_far[b],
                            arrayFilter((b, keep) -> keep, stores_before_removal, kept)) AS kept_before
            FROM
            (
                SELECT instance, dp_rank, xs, distances, tokens, stores_before_removal,
                       arrayMap((d, i, b) -> d - greatest(toInt64(i) - 1 - toInt64(b), 0) < x_max,
                                distances, arrayEnumerate(distances), stores_before_removal) AS kept,
                       arrayCumSum(kept) AS kept_so_far
                FROM streams
            )
        )
        ARRAY JOIN xs AS x, arrayEnumerate(xs) AS k
    )
    GROUP BY instance, dp_rank, k
),
per_source AS
(
    SELECT
        s.instance AS instance, s.dp_rank AS dp_rank, fraction, s.capacity_blocks AS cap,
        toUInt64(floor(s.capacity_blocks * fraction)) AS extra, s.queries AS q, s.hits AS h,
        v.saved_first_tokens AS saved, v.saved_corrected_tokens AS saved_c
    FROM stats AS s
    ARRAY JOIN {fractions:Array(Float64)} AS fraction, arrayEnumerate({fractions:Array(Float64)}) AS k
    LEFT JOIN saved AS v ON v.instance = s.instance AND v.dp_rank = s.dp_rank AND v.k = k
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

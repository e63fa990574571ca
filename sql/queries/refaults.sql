-- Refaults per source: blocks stored again after this source evicted them, and their refault distances (evictions in between).
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- A refault is a BlockStored whose hash last left this source by a BlockRemoved, in the same
-- epoch, with no AllBlocksCleared since (in the full history: a removal before `since` counts).
-- Stores in [since, until) only. Distance quantiles are t-digest estimates.
WITH
-- include: stores_in_window
SELECT
    instance,
    dp_rank,
    medium,
    count() AS stores,
    sum(refault) AS refaults,
    refaults / stores AS refault_share,
    sumIf(tokens, refault = 1) AS refault_tokens,
    quantilesTDigestIf(0.5, 0.9, 0.99)(toFloat64(refault_distance), refault = 1)[1] AS distance_p50,
    quantilesTDigestIf(0.5, 0.9, 0.99)(toFloat64(refault_distance), refault = 1)[2] AS distance_p90,
    quantilesTDigestIf(0.5, 0.9, 0.99)(toFloat64(refault_distance), refault = 1)[3] AS distance_p99,
    maxIfOrNull(refault_distance, refault = 1) AS distance_max
FROM stores
WHERE ({instance:String} = '' OR instance = {instance:String})
GROUP BY instance, dp_rank, medium
ORDER BY instance, dp_rank, medium

-- Routing opportunity per source: blocks stored while the same hash was resident on another source of the same model and role (a hit a prefix-aware router could have had).
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Residency comes from the block_intervals fragment; a sweep over each (model, role, medium,
-- hash) ordered by time counts the sources holding the hash (an end at the same instant as a
-- start counts first; partitioned by block_hash and a 64-bit hash of model, role, medium). Role matters: in prefill/decode disaggregation the decode side always
-- holds what its prefill side computed, which no router could have avoided.
WITH
-- include: block_intervals
,
swept AS
(
    SELECT
        instance, dp_rank, tokens, delta,
        sum(delta) OVER (
            PARTITION BY block_hash, group_key ORDER BY t, delta
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS holders
    FROM
    (
        SELECT
            instance, dp_rank, tokens, block_hash, cityHash64(model, role, medium) AS group_key,
            tupleElement(mark, 1) AS t, tupleElement(mark, 2) AS delta
        FROM block_intervals
        ARRAY JOIN if(end_kind = 'open', [(start_ts, toInt8(1))],
                      [(start_ts, toInt8(1)), (end_ts, toInt8(-1))]) AS mark
    )
)
SELECT
    instance,
    dp_rank,
    countIf(delta = 1) AS stores,
    countIf(delta = 1 AND holders > 1) AS opportunity_blocks,
    opportunity_blocks / stores AS opportunity_share,
    sumIf(tokens, delta = 1) AS stored_tokens,
    sumIf(tokens, delta = 1 AND holders > 1) AS opportunity_tokens
FROM swept
WHERE {instance:String} = '' OR instance = {instance:String}
GROUP BY instance, dp_rank
ORDER BY instance, dp_rank

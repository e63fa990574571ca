-- Routing opportunity per source: blocks stored while the same hash was resident on another source of the same model and role (a hit a prefix-aware router could have had).
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Stores in [since, until); residency from the block_intervals fragment (blocks resident at
-- `since` carried in, so a hash held elsewhere since before the window counts); a sweep over each (model, role, medium,
-- hash) ordered by time counts the sources holding the hash (an end at the same instant as a
-- start counts first). The sweep carries 64-bit keys only (block hash, cityHash64 of model,
-- role, medium; of instance, dp_rank) and names the sources at the end: sorting is the cost.
-- Role matters: in prefill/decode disaggregation the decode side always holds what its
-- prefill side computed, which no router could have avoided.
WITH
-- include: block_intervals
,
swept AS
(
    SELECT
        source_id, tokens, delta, carried_in,
        sum(delta) OVER (
            PARTITION BY block_hash, group_key ORDER BY t, delta
            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS holders
    FROM
    (
        SELECT
            cityHash64(instance, dp_rank) AS source_id, tokens, block_hash, carried_in,
            cityHash64(model, role, medium) AS group_key,
            tupleElement(mark, 1) AS t, tupleElement(mark, 2) AS delta
        FROM block_intervals
        ARRAY JOIN if(end_kind = 'open', [(start_ts, toInt8(1))],
                      [(start_ts, toInt8(1)), (end_ts, toInt8(-1))]) AS mark
    )
),
per_source AS
(
    SELECT
        source_id,
        countIf(delta = 1 AND carried_in = 0) AS stores,
        countIf(delta = 1 AND carried_in = 0 AND holders > 1) AS opportunity,
        sumIf(tokens, delta = 1 AND carried_in = 0) AS stored,
        sumIf(tokens, delta = 1 AND carried_in = 0 AND holders > 1) AS opportunity_tok
    FROM swept
    GROUP BY source_id
),
source_names AS
(
    SELECT DISTINCT instance, dp_rank, cityHash64(instance, dp_rank) AS source_id
    FROM kv_residency_progress
)
SELECT
    n.instance AS instance,
    n.dp_rank AS dp_rank,
    p.stores AS stores,
    p.opportunity AS opportunity_blocks,
    p.opportunity / p.stores AS opportunity_share,
    p.stored AS stored_tokens,
    p.opportunity_tok AS opportunity_tokens
FROM per_source AS p
INNER JOIN source_names AS n ON n.source_id = p.source_id
WHERE {instance:String} = '' OR n.instance = {instance:String}
ORDER BY instance, dp_rank

-- Routing opportunity per source: blocks stored while the same hash was resident on another source of the same model and role (a hit a prefix-aware router could have had).
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Stores in [since, until); residency from the materialized intervals (blocks resident at
-- `since` carried in, so a hash held elsewhere since before the window counts): the closed
-- ones from kv_block_intervals_by_hash (the intervals of kv_block_intervals in block-hash
-- order, with 64-bit keys: cityHash64 of model, role, medium as group_key, of instance,
-- dp_rank as source_id; migration 009) and the open ones from kv_block_open, ended at
-- `until` or, in an epoch a restart ended, then (`_open_in_window.sql`). A store is an
-- opportunity when an interval of the same hash (same model, role, medium) that started
-- before it still holds the block at its start (an end at the same instant as a start
-- comes first): the running maximum of interval ends over each hash's
-- intervals in start order, one window pass over the intervals (not over their start and
-- end marks). Intervals that start at the same instant are taken shortest first, then by
-- source, then fewest tokens first, so the answer never depends on the order rows arrive
-- in (a zero-length interval, stored and removed at one instant, holds nothing for a store
-- at that instant; two intervals of one source with the same start and end, which only a
-- clock that steps back makes, are then taken in one order, so the same one's tokens count
-- as held elsewhere). Sorting is the cost (the tokens tie-break adds none measurable); the
-- closed intervals of each hour of end_ts come already in that order.
-- The same rows and rules as the `block_intervals` fragment (`_block_intervals.sql`),
-- which the tests check this against.
-- Role matters: in prefill/decode disaggregation the decode side always holds what its
-- prefill side computed, which no router could have avoided.
WITH
-- include: open_in_window
,
intervals AS
(
    SELECT
        source_id, tokens, toUInt8(start_ts < {since:DateTime64(6)}) AS carried_in,
        block_hash, group_key, toUnixTimestamp64Micro(start_ts) AS start_us,
        toUnixTimestamp64Micro(least(end_ts, {until:DateTime64(6)})) AS end_us
    FROM kv_block_intervals_by_hash AS i
    WHERE
-- include: closed_in_window
    UNION ALL
    SELECT
        cityHash64(instance, dp_rank) AS source_id, tokens,
        toUInt8(start_ts < {since:DateTime64(6)}) AS carried_in,
        block_hash, cityHash64(model, role, medium) AS group_key,
        toUnixTimestamp64Micro(start_ts) AS start_us, toUnixTimestamp64Micro(ended_ts) AS end_us
    FROM open_blocks
),
swept AS
(
    SELECT
        source_id, tokens, carried_in,
        max(end_us) OVER (
            PARTITION BY block_hash, group_key ORDER BY start_us, end_us, source_id, tokens
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) > start_us AS held_elsewhere
    FROM intervals
),
per_source AS
(
    SELECT
        source_id,
        countIf(carried_in = 0) AS stores,
        countIf(carried_in = 0 AND held_elsewhere) AS opportunity,
        sumIf(tokens, carried_in = 0) AS stored,
        sumIf(tokens, carried_in = 0 AND held_elsewhere) AS opportunity_tok
    FROM swept
    GROUP BY source_id
),
source_names AS
(
    -- a GROUP BY, which the progress's `latest` projection answers (a DISTINCT reads every row)
    SELECT instance, dp_rank, cityHash64(instance, dp_rank) AS source_id
    FROM kv_residency_progress
    GROUP BY instance, dp_rank
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

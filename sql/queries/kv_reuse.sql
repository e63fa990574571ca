-- KV reuse per source: how old the blocks requests hit were, and how old and how often reused the blocks evicted were.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- Needs the access stream (kv_accesses). A hit: one of the leading hit_blocks hashes of a
-- BlockAccess released in [since, until); its age is its lookup time minus the time the
-- source last stored that hash before the lookup (BlockStored, any time before until).
-- An eviction: a BlockRemoved in [since, until); its age is its time minus the time the
-- source last stored the hash before it, its reuse count the hits (in the window) on that
-- stored copy. A hit whose store is not found (vLLM stamps a step's BlockStored after that
-- step's admissions, so a block stored and hit in one step has none yet) is left out.
-- Ages in seconds; p50/p90 are exact lower quantiles.
WITH
hits AS
(
    SELECT instance, dp_rank, lookup_ts, h AS block_hash
    FROM kv_accesses
    ARRAY JOIN arraySlice(block_hashes, 1, hit_blocks) AS h
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
      AND ({instance:String} = '' OR instance = {instance:String})
),
stores AS
(
    SELECT instance, dp_rank, block_hash, ts AS stored_ts
    FROM kv_block_events
    WHERE event = 'stored' AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
      AND ({instance:String} = '' OR instance = {instance:String})
),
aged AS
(
    SELECT h.instance AS instance, h.dp_rank AS dp_rank, h.block_hash AS block_hash,
           s.stored_ts AS stored_ts,
           dateDiff('microsecond', s.stored_ts, h.lookup_ts) / 1e6 AS age_s
    FROM hits AS h
    ASOF JOIN stores AS s
      ON h.instance = s.instance AND h.dp_rank = s.dp_rank AND h.block_hash = s.block_hash
     AND h.lookup_ts >= s.stored_ts
),
evicted AS
(
    SELECT r.instance AS instance, r.dp_rank AS dp_rank, r.block_hash AS block_hash,
           s.stored_ts AS stored_ts,
           dateDiff('microsecond', s.stored_ts, r.ts) / 1e6 AS age_s
    FROM
    (
        SELECT instance, dp_rank, block_hash, ts
        FROM kv_block_events
        WHERE event = 'removed' AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
          AND ({model:String} = '' OR model = {model:String})
          AND ({instance:String} = '' OR instance = {instance:String})
    ) AS r
    ASOF JOIN stores AS s
      ON r.instance = s.instance AND r.dp_rank = s.dp_rank AND r.block_hash = s.block_hash
     AND r.ts >= s.stored_ts
),
reuse AS
(
    SELECT instance, dp_rank, block_hash, stored_ts, count() AS reused
    FROM aged
    GROUP BY instance, dp_rank, block_hash, stored_ts
),
per_hit AS
(
    SELECT instance, dp_rank, count() AS hits, quantilesExactLow(0.5, 0.9)(age_s) AS q
    FROM aged
    GROUP BY instance, dp_rank
),
per_eviction AS
(
    SELECT e.instance AS instance, e.dp_rank AS dp_rank, count() AS evictions,
           quantilesExactLow(0.5, 0.9)(e.age_s) AS q, avg(r.reused) AS mean_reuse,
           countIf(r.reused = 0) / count() AS never_reused_share
    FROM evicted AS e
    LEFT JOIN reuse AS r
      ON r.instance = e.instance AND r.dp_rank = e.dp_rank AND r.block_hash = e.block_hash
     AND r.stored_ts = e.stored_ts
    GROUP BY e.instance, e.dp_rank
)
SELECT
    if(h.instance = '', e.instance, h.instance) AS instance,
    if(h.instance = '', e.dp_rank, h.dp_rank) AS dp_rank,
    h.hits AS hits,
    if(h.hits = 0, NULL, h.q[1]) AS hit_age_p50_s,
    if(h.hits = 0, NULL, h.q[2]) AS hit_age_p90_s,
    e.evictions AS evictions,
    if(e.evictions = 0, NULL, e.q[1]) AS eviction_age_p50_s,
    if(e.evictions = 0, NULL, e.q[2]) AS eviction_age_p90_s,
    if(e.evictions = 0, NULL, e.mean_reuse) AS mean_reuse_at_eviction,
    if(e.evictions = 0, NULL, e.never_reused_share) AS never_reused_share
FROM per_hit AS h
FULL OUTER JOIN per_eviction AS e ON h.instance = e.instance AND h.dp_rank = e.dp_rank
ORDER BY instance, dp_rank

-- Fragment: the staged events' per-hash chains and the committed state they continue.
-- chain: each stored/removed event with its neighbours in its chain (source, medium, hash,
-- clear generation) inside the increment; chain_pos = 1 for the chain's first event here.
-- clears: the staged AllBlocksCleared rows (clear_gen = the generation they start).
-- prior_open: committed open intervals the increment touches (its hashes; every one of a
-- source it clears); prior_evicted: committed last
-- removals of the hashes stored in the increment. Joins match on 64-bit cityHash64 keys
-- (`link`: source, medium, hash, clear generation), several times cheaper than the columns.
chain AS
(
    SELECT
        instance, dp_rank, model, role, epoch, medium, block_hash, tokens, ts, event, ord,
        clear_gen, removals_so_far,
        cityHash64(instance, dp_rank, epoch, medium, block_hash, clear_gen) AS link,
        cityHash64(instance, dp_rank, epoch, clear_gen + 1) AS next_clear,
        row_number() OVER hash_order AS chain_pos,
        lagInFrame(toUInt8(event), 1, 0) OVER hash_order AS prev_event,
        lagInFrame(ord, 1, 0) OVER hash_order AS prev_ord,
        lagInFrame(removals_so_far, 1, 0) OVER hash_order AS prev_removals,
        leadInFrame(toUInt8(event), 1, 0) OVER hash_order AS next_event,
        leadInFrame(ts, 1, ts) OVER hash_order AS next_ts
    FROM kv_residency_stage_events
    WHERE event != 'cleared'
    WINDOW hash_order AS (
        PARTITION BY block_hash, cityHash64(instance, dp_rank, epoch, medium, clear_gen)
        ORDER BY ord ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
clears AS
(
    SELECT instance, dp_rank, epoch, clear_gen, ts AS clear_ts, ord AS clear_ord, 1 AS found,
           cityHash64(instance, dp_rank, epoch, clear_gen) AS clear_key
    FROM kv_residency_stage_events
    WHERE event = 'cleared'
),
prior_open AS
(
    SELECT *, 1 AS found,
           cityHash64(instance, dp_rank, epoch, medium, block_hash, clear_gen) AS link
    FROM kv_block_open FINAL
    WHERE (instance, dp_rank, epoch, medium, block_hash) IN
        (SELECT instance, dp_rank, epoch, medium, block_hash FROM kv_residency_stage_events)
       OR (instance, dp_rank, epoch) IN
        (SELECT instance, dp_rank, epoch FROM kv_residency_stage_events WHERE event = 'cleared')
),
prior_evicted AS
(
    SELECT removal_ord, removals_so_far, 1 AS found,
           cityHash64(instance, dp_rank, epoch, medium, block_hash, clear_gen) AS link
    FROM kv_block_evicted FINAL
    WHERE (instance, dp_rank, epoch, medium, block_hash) IN
        (SELECT instance, dp_rank, epoch, medium, block_hash
         FROM kv_residency_stage_events WHERE event = 'stored')
),
stores AS
(
    SELECT
        s.instance AS instance, s.dp_rank AS dp_rank, s.model AS model, s.role AS role,
        s.epoch AS epoch, s.medium AS medium, s.block_hash AS block_hash, s.tokens AS tokens,
        s.ts AS start_ts, s.ord AS store_ord, s.clear_gen AS clear_gen,
        multiIf(s.chain_pos > 1, s.prev_event,
                o.found = 1 AND (v.found = 0 OR o.store_ord > v.removal_ord), 1,
                v.found = 1, 2, 0) AS p_event,
        multiIf(s.chain_pos > 1, s.prev_ord, p_event = 2, v.removal_ord, 0) AS p_ord,
        multiIf(s.chain_pos > 1, s.prev_removals, p_event = 2, v.removals_so_far, 0) AS p_removals,
        toUInt8(p_event = 2) AS refault,
        if(p_event = 2, s.removals_so_far - p_removals, 0) AS refault_distance,
        if(p_event = 2, p_ord, 0) AS removal_ord,
        multiIf(s.next_event = 2, 'removed', s.next_event = 1, 'restored',
                c.found = 1, 'cleared', 'open') AS end_kind,
        multiIf(s.next_event != 0, s.next_ts, c.found = 1, c.clear_ts, s.ts) AS end_ts
    FROM chain AS s
    LEFT JOIN prior_open AS o ON o.link = s.link
    LEFT JOIN prior_evicted AS v ON v.link = s.link
    LEFT JOIN clears AS c ON c.clear_key = s.next_clear
    WHERE s.event = 'stored'
),
prior_closed AS
(
    SELECT
        o.instance AS instance, o.dp_rank AS dp_rank, o.model AS model, o.role AS role,
        o.epoch AS epoch, o.medium AS medium, o.block_hash AS block_hash, o.tokens AS tokens,
        o.start_ts AS start_ts, o.refault AS refault, o.refault_distance AS refault_distance,
        o.store_ord AS store_ord, o.removal_ord AS removal_ord,
        if(f.found = 1, if(f.first_event = 'removed', 'removed', 'restored'), 'cleared') AS end_kind,
        if(f.found = 1, f.first_ts, c.clear_ts) AS end_ts,
        if(f.found = 1, f.first_ord, c.clear_ord) AS end_ord
    FROM prior_open AS o
    LEFT JOIN
    (
        SELECT instance, dp_rank, epoch, medium, block_hash, clear_gen,
               argMin(event, ord) AS first_event, argMin(ts, ord) AS first_ts,
               min(ord) AS first_ord, 1 AS found
        FROM kv_residency_stage_events
        WHERE event != 'cleared' AND (instance, dp_rank, epoch, medium, block_hash) IN
            (SELECT instance, dp_rank, epoch, medium, block_hash FROM prior_open)
        GROUP BY instance, dp_rank, epoch, medium, block_hash, clear_gen
    ) AS f
        ON f.instance = o.instance AND f.dp_rank = o.dp_rank AND f.epoch = o.epoch
        AND f.medium = o.medium AND f.block_hash = o.block_hash AND f.clear_gen = o.clear_gen
    LEFT JOIN clears AS c
        ON c.instance = o.instance AND c.dp_rank = o.dp_rank AND c.epoch = o.epoch
        AND c.clear_gen = o.clear_gen + 1
    WHERE f.found = 1 OR c.found = 1
)

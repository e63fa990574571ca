-- Fragment: the staged events' chains joined with the committed state they continue.
-- chains: one row per chain (source, medium, hash, clear generation) inside the increment,
-- grouped by (block_hash, a 64-bit hash of the rest) like the window definition's partition;
-- `events` holds its stored/removed events as (ord, event, ts, removals_so_far, tokens,
-- model, role) in ord order. clears: the staged AllBlocksCleared rows (clear_gen = the
-- generation they start). prior_open: committed open intervals the increment touches (its
-- hashes; every one of a source it clears); prior_evicted: committed last removals of the
-- hashes stored in the increment; both empty without committed state, both selected by
-- PREWHERE on 64-bit hashes of their key columns (before FINAL, exact since every version of
-- a key has them; a hash collision only adds a row that matches no chain and no clear), and
-- first on the source epochs of the increment (prior_evicted: on its stored keys), which the
-- tables' primary key (instance, dp_rank, epoch, ...) turns into ranges: the rows of other
-- sources and of epochs a restart ended are not read (on the 100M benchmark data, whose
-- sources restarted four times, 669 of kv_block_evicted's 3,021 granules are read;
-- docs/benchmarks/history.md). That set only selects granules (`indexHint`): the key hashes above
-- also hold the source epoch, so testing it per row again only cost time (a refresh on the
-- 100M data 0.968 -> 0.761 s median). prior_evicted checks the
-- block_hash column alone against the increment's stored hashes before hashing five key
-- columns per row (it drops only rows that match no chain; the prior_evicted read 0.25-0.34
-- -> 0.22-0.23 s, a refresh 0.934 -> 0.882 s median on the 100M data, whose current epochs
-- hold 5M last removals). touched: every chain
-- and every committed open interval, matched on (`link`, block_hash), `link` = 64-bit
-- cityHash64 of source, medium, hash and clear generation. chains_joined: each with the
-- chain's last removal before the increment and the clear that ends its clear generation,
-- and `ext`: `events` behind one leading element (position 1: the committed open interval),
-- with the previous / next event of each element in arrays of the same length.
chains AS
(
    SELECT
        block_hash, any(instance) AS g_instance, any(dp_rank) AS g_dp_rank,
        any(epoch) AS g_epoch, any(medium) AS g_medium, any(clear_gen) AS g_clear_gen,
        cityHash64(g_instance, g_dp_rank, g_epoch, g_medium, block_hash, g_clear_gen) AS link,
        arraySort(groupArray((ord, toUInt8(event), ts, removals_so_far, tokens, model, role)))
            AS events,
        1 AS found
    FROM kv_residency_stage_events
    WHERE event != 'cleared'
    GROUP BY block_hash, cityHash64(instance, dp_rank, epoch, medium, clear_gen)
),
clears AS
(
    SELECT ts AS clear_ts, ord AS clear_ord, 1 AS found,
           cityHash64(instance, dp_rank, epoch, clear_gen) AS clear_key
    FROM kv_residency_stage_events
    WHERE event = 'cleared'
),
prior_open AS
(
    SELECT *, 1 AS found,
           cityHash64(instance, dp_rank, epoch, medium, block_hash, clear_gen) AS link
    FROM kv_block_open FINAL
    PREWHERE {committed:UInt64} > 0
      AND indexHint((instance, dp_rank, epoch) IN
        (SELECT instance, dp_rank, epoch FROM kv_residency_stage_events))
      AND (cityHash64(instance, dp_rank, epoch, medium, block_hash) IN
            (SELECT cityHash64(instance, dp_rank, epoch, medium, block_hash)
             FROM kv_residency_stage_events)
           OR cityHash64(instance, dp_rank, epoch) IN
            (SELECT cityHash64(instance, dp_rank, epoch)
             FROM kv_residency_stage_events WHERE event = 'cleared'))
),
prior_evicted AS
(
    SELECT removal_ord, removals_so_far, 1 AS found,
           cityHash64(instance, dp_rank, epoch, medium, block_hash, clear_gen) AS link
    FROM kv_block_evicted FINAL
    PREWHERE {committed:UInt64} > 0
      AND indexHint((instance, dp_rank, epoch, medium, block_hash) IN
        (SELECT instance, dp_rank, epoch, medium, block_hash
         FROM kv_residency_stage_events WHERE event = 'stored'))
      AND block_hash IN (SELECT block_hash FROM kv_residency_stage_events WHERE event = 'stored')
      AND cityHash64(instance, dp_rank, epoch, medium, block_hash) IN
        (SELECT cityHash64(instance, dp_rank, epoch, medium, block_hash)
         FROM kv_residency_stage_events WHERE event = 'stored')
),
touched AS
(
    SELECT
        if(g.found = 1, g.g_instance, o.instance) AS instance,
        if(g.found = 1, g.g_dp_rank, o.dp_rank) AS dp_rank,
        if(g.found = 1, g.g_epoch, o.epoch) AS epoch,
        if(g.found = 1, g.g_medium, o.medium) AS medium,
        if(g.found = 1, g.block_hash, o.block_hash) AS block_hash,
        if(g.found = 1, g.g_clear_gen, o.clear_gen) AS clear_gen,
        g.link AS link, g.found AS chain_found, g.events AS events,
        o.found AS o_found, o.model AS o_model, o.role AS o_role, o.tokens AS o_tokens,
        o.start_ts AS o_start_ts, o.refault AS o_refault,
        o.refault_distance AS o_refault_distance, o.store_ord AS o_store_ord,
        o.removal_ord AS o_removal_ord
    FROM chains AS g
    FULL JOIN prior_open AS o ON o.link = g.link AND o.block_hash = g.block_hash
),
chains_joined AS
(
    SELECT
        t.*, v.found AS v_found, v.removal_ord AS v_removal_ord,
        v.removals_so_far AS v_removals_so_far,
        c.found AS clear_found, c.clear_ts AS clear_ts, c.clear_ord AS clear_ord,
        events[1].1 AS first_ord, events[1].2 AS first_event, events[1].3 AS first_ts,
        arrayPushFront(events, events[1]) AS ext,
        arrayPushFront(arrayPopBack(arrayMap(x -> x.2, ext)), 0) AS ext_prev_event,
        arrayPushFront(arrayPopBack(arrayMap(x -> x.1, ext)), 0) AS ext_prev_ord,
        arrayPushFront(arrayPopBack(arrayMap(x -> x.4, ext)), 0) AS ext_prev_removals,
        arrayPushBack(arrayPopFront(arrayMap(x -> x.2, ext)), 0) AS ext_next_event,
        arrayPushBack(arrayPopFront(arrayMap(x -> x.3, ext)), first_ts) AS ext_next_ts
    FROM touched AS t
    LEFT JOIN prior_evicted AS v ON v.link = t.link
    LEFT JOIN clears AS c
        ON c.clear_key = cityHash64(t.instance, t.dp_rank, t.epoch, t.clear_gen + 1)
)

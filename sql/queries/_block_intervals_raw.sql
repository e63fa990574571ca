-- Fragment, not a query: the residency intervals of block hashes, for `-- include: block_intervals`.
-- CTE `block_intervals`: one row per BlockStored hash on a source (instance, dp_rank, epoch,
-- medium) with start_ts, end_ts and end_kind: 'removed' (next BlockRemoved of the hash),
-- 'cleared' (next AllBlocksCleared of the source), 'restored' (stored again without a removal,
-- vLLM's rare duplicate copy), 'restarted' (none of these, and a restart ended the epoch
-- before `until`: end_ts = the first event of the source's next epoch, or the store if
-- later; `_epoch_restarts.sql`) or 'open' (still resident: end_ts = until, censored);
-- refault = 1 when the hash's previous departure from this source was a BlockRemoved with no
-- clear since, refault_distance = BlockRemoved rows on the source between that removal and
-- this store; store_ord / removal_ord are the positions (row number in the source's stream)
-- of this store and of that removal. Events are ordered per source by (seq, event_index,
-- position), the table's key; the per-hash pass partitions by (block_hash, a 64-bit hash of source, medium and clear
-- generation) because sorting on two integers is several times faster than on the columns.
-- Parameters: since, until (DateTime64(6)), model ('' = all).
block_events AS
(
    SELECT
        instance, dp_rank, model, role, epoch, ts, event, medium, block_hash, tokens,
        row_number() OVER source_order AS ord,
        sum(toUInt64(event = 'cleared')) OVER source_order AS clear_gen,
        sum(toUInt64(event = 'removed')) OVER source_order AS removals_so_far,
        cityHash64(instance, dp_rank, epoch, medium, clear_gen) AS chain_key
    FROM kv_block_events
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    WINDOW source_order AS (
        PARTITION BY instance, dp_rank, epoch ORDER BY seq, event_index, position
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
block_clears AS
(
    SELECT
        instance, dp_rank, epoch, ts AS clear_ts,
        toUInt64(row_number() OVER (PARTITION BY instance, dp_rank, epoch ORDER BY seq, event_index)) AS clear_gen
    FROM kv_block_events
    WHERE event = 'cleared' AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
),
block_chain AS
(
    SELECT
        instance, dp_rank, model, role, epoch, medium, block_hash, tokens, ts, event,
        clear_gen, removals_so_far, ord,
        lagInFrame(toUInt8(event), 1, 0) OVER hash_order AS prev_event,
        lagInFrame(ord, 1, 0) OVER hash_order AS prev_ord,
        lagInFrame(removals_so_far, 1, 0) OVER hash_order AS prev_removals,
        leadInFrame(toUInt8(event), 1, 0) OVER hash_order AS next_event,
        leadInFrame(ts, 1, ts) OVER hash_order AS next_ts
    FROM block_events
    WHERE event != 'cleared'
    WINDOW hash_order AS (
        PARTITION BY block_hash, chain_key ORDER BY ord
        ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
epoch_starts AS
(
    -- every model's: an engine restarted with another model has emptied its cache too
    SELECT instance, dp_rank, epoch, min(ts) AS first_ts
    FROM kv_block_events
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
    GROUP BY instance, dp_rank, epoch
),
-- include: epoch_restarts
,
block_intervals AS
(
    SELECT
        s.instance AS instance, s.dp_rank AS dp_rank, s.model AS model, s.role AS role,
        s.epoch AS epoch, s.medium AS medium, s.block_hash AS block_hash, s.tokens AS tokens,
        s.ts AS start_ts,
        multiIf(s.next_event = 2, 'removed', s.next_event = 1, 'restored',
                c.clear_gen > 0, 'cleared', r.superseded = 1, 'restarted', 'open') AS end_kind,
        multiIf(s.next_event != 0, s.next_ts, c.clear_gen > 0, c.clear_ts,
                r.superseded = 1, greatest(s.ts, r.restart_ts), {until:DateTime64(6)}) AS end_ts,
        toUInt8(s.prev_event = 2) AS refault,
        if(s.prev_event = 2, s.removals_so_far - s.prev_removals, 0) AS refault_distance,
        s.ord AS store_ord,
        if(s.prev_event = 2, s.prev_ord, 0) AS removal_ord
    FROM block_chain AS s
    LEFT JOIN block_clears AS c
        ON c.instance = s.instance AND c.dp_rank = s.dp_rank AND c.epoch = s.epoch
        AND c.clear_gen = s.clear_gen + 1
    LEFT JOIN epoch_restarts AS r
        ON r.instance = s.instance AND r.dp_rank = s.dp_rank AND r.epoch = s.epoch
    WHERE s.event = 'stored'
)

-- Fragment, not a query: residency intervals of block hashes overlapping [since, until), for `-- include: block_intervals`.
-- Read from the materialized tables (kvscope.collector.storage.residency; columns in
-- docs/analytics.md), not re-derived: the committed closed intervals (kv_block_intervals)
-- plus the open ones (kv_block_open, through `_open_in_window.sql`). CTE `block_intervals`:
-- one row per BlockStored hash on a source (instance, dp_rank, epoch, medium) whose interval
-- overlaps the window: stored before `until` and not ended before `since`. Blocks resident
-- at `since` are carried in (carried_in = 1, start_ts < since), so any window gives the full
-- history's answer restricted to it. end_kind (an Enum8, so comparing it costs no string per
-- row): 'removed', 'cleared', 'restored' (ended before `until`), 'restarted' (still resident
-- when a restart ended its epoch: end_ts = the next epoch's first block event) or 'open'
-- (still resident at `until`: end_ts = until, censored). refault, refault_distance,
-- store_ord and removal_ord as in `_block_intervals_raw.sql` (the window-function definition
-- these tables equal), positions counted from the start of the source's epoch.
-- The closed ones are filtered by `_closed_in_window.sql` (why it names `i.end_ts` there).
-- Parameters: since, until (DateTime64(6)); model ('' = all).
-- include: open_in_window
,
block_intervals AS
(
    SELECT
        instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts,
        CAST(if(end_ts >= {until:DateTime64(6)}, 0, toInt8(end_kind)),
            'Enum8(''open'' = 0, ''removed'' = 1, ''cleared'' = 2, ''restored'' = 3,
                   ''restarted'' = 4)') AS end_kind,
        least(end_ts, {until:DateTime64(6)}) AS end_ts,
        refault, refault_distance, store_ord, removal_ord,
        toUInt8(start_ts < {since:DateTime64(6)}) AS carried_in
    FROM kv_block_intervals AS i
    WHERE
-- include: closed_in_window
    UNION ALL
    SELECT
        instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts,
        CAST(superseded * 4,
            'Enum8(''open'' = 0, ''removed'' = 1, ''cleared'' = 2, ''restored'' = 3,
                   ''restarted'' = 4)') AS end_kind,
        ended_ts AS end_ts,
        refault, refault_distance, store_ord, removal_ord,
        toUInt8(start_ts < {since:DateTime64(6)}) AS carried_in
    FROM open_blocks
)

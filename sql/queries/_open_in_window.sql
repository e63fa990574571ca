-- Fragment, not a query: the open intervals (kv_block_open) that overlap [since, until), for `-- include: open_in_window`.
-- CTE `open_blocks`: every column of kv_block_open's latest rows stored before `until`, plus
-- `superseded` and `ended_ts`. A block still resident when a restart ended its epoch
-- (`_epoch_restarts.sql`: the next epoch of its instance and dp_rank had its first block
-- event before `until`) ends then (superseded = 1, ended_ts = restart_ts, or its own start if
-- that came later: an engine that kept running under a reused name); one ended before
-- `since` is not in the window. Every other open interval is still resident at `until`
-- (superseded = 0, ended_ts = until). When each epoch began and its latest event come from
-- the progress's `latest` projection (migration 010), one row per source epoch.
-- Only the epochs that can have a row in the window are read (CTE `window_epochs`: not
-- ended by a restart before `since`, or with an event since then, so a row stored since
-- then), found by kv_block_open's primary key: the blocks every earlier engine run left
-- open cost nothing, rather than a read of each at every query. `indexHint`: the set only
-- selects granules, it is not evaluated per row (that costs a third more on a window that
-- needs every epoch); the join and the filter below keep exactly the right rows.
-- Parameters: since, until (DateTime64(6)); model ('' = all).
epoch_starts AS
(
    SELECT instance, dp_rank, epoch, min(first_ts) AS first_ts, max(last_ts) AS last_ts
    FROM kv_residency_progress
    GROUP BY instance, dp_rank, epoch
),
-- include: epoch_restarts
,
window_epochs AS
(
    SELECT s.instance AS instance, s.dp_rank AS dp_rank, s.epoch AS epoch
    FROM epoch_starts AS s
    LEFT JOIN epoch_restarts AS r
        ON r.instance = s.instance AND r.dp_rank = s.dp_rank AND r.epoch = s.epoch
    WHERE r.superseded = 0 OR r.restart_ts >= {since:DateTime64(6)}
       OR s.last_ts >= {since:DateTime64(6)}
),
open_blocks AS
(
    SELECT
        o.*, r.superseded AS superseded,
        if(r.superseded = 1, greatest(o.start_ts, r.restart_ts), {until:DateTime64(6)}) AS ended_ts
    FROM kv_block_open AS o FINAL
    LEFT JOIN epoch_restarts AS r
        ON r.instance = o.instance AND r.dp_rank = o.dp_rank AND r.epoch = o.epoch
    WHERE indexHint((o.instance, o.dp_rank, o.epoch) IN (SELECT * FROM window_epochs))
      AND o.start_ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR o.model = {model:String})
      AND (r.superseded = 0 OR greatest(o.start_ts, r.restart_ts) >= {since:DateTime64(6)})
)

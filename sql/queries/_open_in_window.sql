-- Fragment, not a query: the open intervals (kv_block_open) that overlap [since, until), for `-- include: open_in_window`.
-- CTE `open_blocks`: every column of kv_block_open's latest rows stored before `until`, plus
-- `superseded` and `ended_ts`. A block still resident when a restart ended its epoch
-- (`_epoch_restarts.sql`: the next epoch of its instance and dp_rank had its first block
-- event before `until`) ends then (superseded = 1, ended_ts = restart_ts, or its own start if
-- that came later: an engine that kept running under a reused name); one ended before
-- `since` is not in the window. Every other open interval is still resident at `until`
-- (superseded = 0, ended_ts = until). When each epoch began comes from the progress's
-- `latest` projection (migration 010), one row per source epoch.
-- Parameters: since, until (DateTime64(6)); model ('' = all).
epoch_starts AS
(
    SELECT instance, dp_rank, epoch, min(first_ts) AS first_ts
    FROM kv_residency_progress
    GROUP BY instance, dp_rank, epoch
),
-- include: epoch_restarts
,
open_blocks AS
(
    SELECT
        o.*, r.superseded AS superseded,
        if(r.superseded = 1, greatest(o.start_ts, r.restart_ts), {until:DateTime64(6)}) AS ended_ts
    FROM kv_block_open AS o FINAL
    LEFT JOIN epoch_restarts AS r
        ON r.instance = o.instance AND r.dp_rank = o.dp_rank AND r.epoch = o.epoch
    WHERE o.start_ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR o.model = {model:String})
      AND (r.superseded = 0 OR greatest(o.start_ts, r.restart_ts) >= {since:DateTime64(6)})
)

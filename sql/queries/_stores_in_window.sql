-- Fragment, not a query: the blocks stored in [since, until) and their refault attributes, for `-- include: stores_in_window`.
-- CTE `stores`: one row per BlockStored hash on a source (instance, dp_rank, epoch, medium)
-- with since <= ts < until: the rows of the `block_intervals` fragment with carried_in = 0,
-- without how or when they ended, so without what `_open_in_window.sql` joins to end the
-- blocks a restart left (~20 ms a query). The committed closed intervals that start in
-- the window (`_closed_in_window.sql`) and the open ones. refault, refault_distance,
-- store_ord and removal_ord as in `_block_intervals_raw.sql`. The open ones are read only
-- in the epochs with an event since `since` (the progress's `latest` projection, migration
-- 010), whose granules kv_block_open's primary key finds (`indexHint`, as in
-- `_open_in_window.sql`; the filter on start_ts keeps the right rows).
-- Parameters: since, until (DateTime64(6)); model ('' = all).
stores AS
(
    SELECT instance, dp_rank, epoch, medium, tokens, refault, refault_distance, store_ord, removal_ord
    FROM kv_block_intervals AS i
    WHERE i.start_ts >= {since:DateTime64(6)} AND
-- include: closed_in_window
    UNION ALL
    SELECT instance, dp_rank, epoch, medium, tokens, refault, refault_distance, store_ord, removal_ord
    FROM kv_block_open FINAL
    WHERE indexHint((instance, dp_rank, epoch) IN
        (
            SELECT instance, dp_rank, epoch FROM kv_residency_progress
            GROUP BY instance, dp_rank, epoch HAVING max(last_ts) >= {since:DateTime64(6)}
        ))
      AND start_ts >= {since:DateTime64(6)} AND start_ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
)

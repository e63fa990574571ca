-- Fragment, not a query: the filter of the committed closed intervals (table alias `i`, kv_block_intervals or its by-hash copy) that overlap [since, until), for `-- include: closed_in_window` after a WHERE.
-- Committed: generation at most the committed one (kv_residency_progress), so what a crashed
-- publish left behind is not read. It names the table's own end_ts (`i.end_ts`): a WHERE sees
-- the SELECT's aliases, and an alias end_ts (least(end_ts, until)) would keep the primary key
-- (hour of end_ts) from skipping the hours before `since`, so a one-hour window would read
-- the whole history.
-- Parameters: since, until (DateTime64(6)); model ('' = all).
i.end_ts >= {since:DateTime64(6)} AND i.start_ts < {until:DateTime64(6)}
    AND i.generation <= (SELECT max(generation) FROM kv_residency_progress)
    AND ({model:String} = '' OR i.model = {model:String})

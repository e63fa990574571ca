-- Report: rows and time span per raw table in the window (fleet summary).
-- Parameters: since, until (DateTime64(6), half-open window), model ('' = all models).
SELECT 'kv_block_events' AS table, count() AS rows, min(ts) AS first_ts, max(ts) AS last_ts
FROM kv_block_events
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
UNION ALL
SELECT 'engine_stats', count(), min(ts), max(ts)
FROM engine_stats
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
UNION ALL
SELECT 'requests', count(), min(ts), max(ts)
FROM requests
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
UNION ALL
SELECT 'kv_transfers', count(), min(ts), max(ts)
FROM kv_transfers
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})

-- Report: every instance seen in the window with its role, model, KV capacity and block size.
-- Parameters: since, until (DateTime64(6), half-open window), model ('' = all models).
-- Capacity and block size come from engine stats (0 when an instance sent none); a reported
-- capacity of 0 is never taken (fragment source_capacity).
WITH seen AS (
    SELECT instance, role, model FROM kv_block_events
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, role, model FROM engine_stats
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, role, model FROM kv_transfers
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
),
-- include: source_capacity
,
stats AS (
    SELECT e.instance AS instance, max(c.known_capacity) AS capacity_blocks,
           max(e.block_size) AS block_size
    FROM engine_stats AS e
    LEFT JOIN source_capacity AS c ON c.instance = e.instance AND c.dp_rank = e.dp_rank
    WHERE e.ts >= {since:DateTime64(6)} AND e.ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR e.model = {model:String})
    GROUP BY e.instance
)
SELECT
    s.instance AS instance,
    any(s.role) AS role,
    any(s.model) AS model,
    any(st.capacity_blocks) AS capacity_blocks,
    any(st.block_size) AS block_size
FROM seen AS s
LEFT JOIN stats AS st ON st.instance = s.instance
GROUP BY s.instance
ORDER BY role DESC, instance

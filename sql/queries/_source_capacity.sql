-- Fragment, not a query: each source's KV capacity, for `-- include: source_capacity`.
-- CTE `source_capacity`: one row per (instance, dp_rank) with known_capacity, the largest
-- capacity the source reported in [since, until), else the last one it reported before.
-- A reported 0 is never taken: a vLLM publisher before the fix read `num_gpu_blocks`
-- after the engine core had shut down and sent 0 with its last EngineStats, and a run
-- shorter than the stats interval sent nothing else.
-- Parameters: since, until (DateTime64(6)); model ('' = all).
source_capacity AS
(
    SELECT instance, dp_rank,
           if(countIf(ts >= {since:DateTime64(6)}) > 0,
              maxIf(capacity_blocks, ts >= {since:DateTime64(6)}),
              argMax(capacity_blocks, ts)) AS known_capacity
    FROM engine_stats
    WHERE capacity_blocks > 0 AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY instance, dp_rank
)

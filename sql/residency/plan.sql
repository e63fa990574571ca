-- Sources with block events past their committed progress: (instance, dp_rank, epoch, committed last seq, stored max seq).
-- Run with join_use_nulls = 1 (a source never derived has last_seq NULL). The GROUP BYs are answered by projections, not scans: kafka_state of kv_block_events, latest of kv_residency_progress (migration 010; every progress row is committed, so no filter on generation keeps it from being used).
SELECT s.instance, s.dp_rank, s.epoch, p.last_seq, s.max_seq
FROM
(
    SELECT instance, dp_rank, epoch, max(seq) AS max_seq
    FROM kv_block_events
    GROUP BY instance, dp_rank, epoch
) AS s
LEFT JOIN
(
    SELECT instance, dp_rank, epoch, argMax(last_seq, generation) AS last_seq
    FROM kv_residency_progress
    GROUP BY instance, dp_rank, epoch
) AS p ON p.instance = s.instance AND p.dp_rank = s.dp_rank AND p.epoch = s.epoch
WHERE p.last_seq IS NULL OR s.max_seq > p.last_seq
ORDER BY s.instance, s.dp_rank, s.epoch

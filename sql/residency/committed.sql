-- The committed generation (0 when nothing was derived yet) and the generation staged but not yet published.
SELECT
    (SELECT max(generation) FROM kv_residency_progress) AS committed,
    (SELECT max(generation) FROM kv_residency_progress_stage) AS staged

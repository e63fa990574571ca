-- Duplication at `until`: share of resident block hashes held by two or more sources of the same model and role, and the blocks spent on copies.
-- Parameters: until (DateTime64(6)); model (String, '' = all).
-- Resident on a source = an interval of the materialized residency open at `until` (stored
-- before it, ended at or after it), in the source's latest epoch that began before `until`
-- (a restart empties the cache; of two epochs that began at the same instant, which only a
-- clock that steps back makes, the higher). The full history counts: a block stored long
-- before is resident if nothing ended it. Reads only intervals ending at or after `until`
-- (the table's key) and the open ones: no window functions, no scan of the raw events.
-- When each epoch began comes from the progress's `latest` projection (migration 010; every
-- progress row is committed), not from every progress row ever written. The open intervals
-- are read only in the granules of those latest epochs, which kv_block_open's primary key
-- finds (`indexHint`: the join keeps the right rows): the blocks earlier engine runs left
-- open are not read at all.
WITH
latest_epoch AS
(
    SELECT instance, dp_rank, argMax(epoch, (first_ts, epoch)) AS epoch
    FROM
    (
        SELECT instance, dp_rank, epoch, min(first_ts) AS first_ts
        FROM kv_residency_progress
        GROUP BY instance, dp_rank, epoch
    )
    WHERE first_ts < {until:DateTime64(6)}
    GROUP BY instance, dp_rank
),
resident AS
(
    SELECT instance, dp_rank, epoch, model, role, medium, block_hash
    FROM kv_block_intervals
    WHERE end_ts >= {until:DateTime64(6)} AND start_ts < {until:DateTime64(6)}
      AND generation <= (SELECT max(generation) FROM kv_residency_progress)
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, model, role, medium, block_hash
    FROM kv_block_open FINAL
    WHERE indexHint((instance, dp_rank, epoch) IN (SELECT * FROM latest_epoch))
      AND start_ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
)
SELECT
    model,
    role,
    medium,
    count() AS resident_hashes,
    countIf(holders >= 2) AS duplicated_hashes,
    duplicated_hashes / resident_hashes AS duplication_share,
    sum(holders) AS resident_blocks,
    sum(holders) - count() AS redundant_blocks
FROM
(
    SELECT any(r.model) AS model, any(r.role) AS role, any(r.medium) AS medium,
           count() AS holders
    FROM resident AS r
    INNER JOIN latest_epoch AS l
        ON l.instance = r.instance AND l.dp_rank = r.dp_rank AND l.epoch = r.epoch
    GROUP BY r.block_hash, cityHash64(r.model, r.role, r.medium)
)
GROUP BY model, role, medium
ORDER BY model, role, medium

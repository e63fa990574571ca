-- Duplication at `until`: share of resident block hashes held by two or more sources of the same model and role, and the blocks spent on copies.
-- Parameters: since, until (DateTime64(6)); model (String, '' = all).
-- Resident on a source = the hash's last event there (in stream order) is a BlockStored after
-- the source's last AllBlocksCleared, in the source's latest epoch (a restart empties the
-- cache). Only events in [since, until) are seen, so blocks stored before `since` are missing.
-- Plain aggregations (no window functions), grouped on 64-bit keys for speed; positions are
-- (seq + 1, event_index) so that "no clear" (the default (0, 0)) precedes every event.
WITH
latest_epoch AS
(
    SELECT instance, dp_rank, argMax(epoch, ts) AS epoch
    FROM kv_block_events
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY instance, dp_rank
),
last_clear AS
(
    SELECT instance, dp_rank, epoch, max((seq + 1, event_index)) AS clear_pos
    FROM kv_block_events
    WHERE event = 'cleared' AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY instance, dp_rank, epoch
),
last_event AS
(
    SELECT
        any(instance) AS e_instance, any(dp_rank) AS e_dp_rank, any(epoch) AS e_epoch,
        any(model) AS e_model, any(role) AS e_role, any(medium) AS e_medium, block_hash,
        argMax(event, (seq, event_index, position)) AS last_kind,
        max((seq + 1, event_index)) AS last_pos
    FROM kv_block_events
    WHERE event != 'cleared' AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY block_hash, cityHash64(instance, dp_rank, epoch, medium)
),
resident AS
(
    SELECT e.e_model AS r_model, e.e_role AS r_role, e.e_medium AS r_medium,
           e.block_hash AS block_hash
    FROM last_event AS e
    INNER JOIN latest_epoch AS l
        ON l.instance = e.e_instance AND l.dp_rank = e.e_dp_rank AND l.epoch = e.e_epoch
    LEFT JOIN last_clear AS c
        ON c.instance = e.e_instance AND c.dp_rank = e.e_dp_rank AND c.epoch = e.e_epoch
    WHERE e.last_kind = 'stored' AND e.last_pos > c.clear_pos
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
    SELECT any(r_model) AS model, any(r_role) AS role, any(r_medium) AS medium,
           count() AS holders
    FROM resident
    GROUP BY block_hash, cityHash64(r_model, r_role, r_medium)
)
GROUP BY model, role, medium
ORDER BY model, role, medium

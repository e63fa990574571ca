-- Duplication at `until`: share of resident block hashes held by two or more sources of the same model and role, and the blocks spent on copies.
-- Parameters: since, until (DateTime64(6)); model (String, '' = all).
-- Resident = an open residency interval at `until` (see the block_intervals fragment; a
-- source holds at most one open interval per hash); only events in [since, until) are seen,
-- so blocks stored before `since` are missing.
WITH
-- include: block_intervals
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
    SELECT model, role, medium, block_hash, count() AS holders
    FROM block_intervals
    WHERE end_kind = 'open'
    GROUP BY model, role, medium, block_hash
)
GROUP BY model, role, medium
ORDER BY model, role, medium

-- The access stream: per request and source, the block hashes it looked up and produced, its hits and times; plus the source's cache clears.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- One row per BlockAccess released in [since, until) (kind 'access') and one per
-- AllBlocksCleared (kind 'clear', only source and ts set), ordered by source and time.
-- Read by `capacity_what_if` to replay the accesses at other cache sizes.
SELECT
    'access' AS kind, instance, dp_rank, role, engine, epoch, ts, request_id, prompt_tokens,
    block_size, hit_blocks, held_blocks, block_hashes, arrival_ts, lookup_ts, free_ts,
    held_until_free
FROM kv_accesses
WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
  AND ({instance:String} = '' OR instance = {instance:String})
UNION ALL
SELECT
    'clear' AS kind, instance, dp_rank, role, engine, epoch, ts, '' AS request_id,
    toUInt32(0) AS prompt_tokens, toUInt32(0) AS block_size, toUInt32(0) AS hit_blocks,
    toUInt32(0) AS held_blocks, CAST([], 'Array(UInt64)') AS block_hashes, ts AS arrival_ts,
    ts AS lookup_ts, ts AS free_ts, toUInt8(0) AS held_until_free
FROM kv_block_events
WHERE event = 'cleared' AND ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
  AND ({model:String} = '' OR model = {model:String})
  AND ({instance:String} = '' OR instance = {instance:String})
ORDER BY instance, dp_rank, ts

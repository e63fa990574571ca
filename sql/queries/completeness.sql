-- Completeness per source, epoch and stream: share of the seq range present in ClickHouse, publisher-declared losses (Gaps) and undeclared holes.
-- Parameters: since, until (DateTime64(6)); instance, model (String, '' = all).
-- expected = seqs from the first to the last seen (data records and Gap records) minus the Gap
-- records themselves; completeness = present / expected. A KV-event batch with no events
-- leaves no row, so its seq counts as missing (engines do not publish empty batches).
WITH
seen AS
(
    SELECT instance, dp_rank, epoch, 'kv-events' AS stream, seq FROM kv_block_events
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, 'engine-stats', seq FROM engine_stats
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, 'requests', seq FROM requests
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, 'kv-transfers', seq FROM kv_transfers
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, 'engine-histograms', seq FROM engine_histograms
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    UNION ALL
    SELECT instance, dp_rank, epoch, 'kv-accesses', seq FROM kv_accesses
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
),
present AS
(
    SELECT instance, dp_rank, epoch, stream, uniqExact(seq) AS present, min(seq) AS lo, max(seq) AS hi
    FROM seen
    GROUP BY instance, dp_rank, epoch, stream
),
gaps AS
(
    SELECT
        instance, dp_rank, epoch, stream,
        countIf(detected_by = 'publisher') AS gap_records,
        sumIf(last_seq - first_seq + 1, detected_by = 'publisher') AS declared_lost,
        minIf(least(seq, first_seq), detected_by = 'publisher') AS gap_lo,
        maxIf(greatest(seq, last_seq), detected_by = 'publisher') AS gap_hi
    FROM stream_gaps
    WHERE ts >= {since:DateTime64(6)} AND ts < {until:DateTime64(6)}
      AND ({instance:String} = '' OR instance = {instance:String})
      AND ({model:String} = '' OR model = {model:String})
    GROUP BY instance, dp_rank, epoch, stream
)
SELECT
    p.instance AS instance,
    p.dp_rank AS dp_rank,
    p.epoch AS epoch,
    p.stream AS stream,
    if(g.gap_records > 0, least(p.lo, g.gap_lo), p.lo) AS first_seq,
    if(g.gap_records > 0, greatest(p.hi, g.gap_hi), p.hi) AS last_seq,
    last_seq - first_seq + 1 - g.gap_records AS expected,
    p.present AS present,
    g.declared_lost AS declared_lost,
    toInt64(expected) - toInt64(present) - toInt64(declared_lost) AS undeclared_missing,
    present / expected AS completeness
FROM present AS p
LEFT JOIN gaps AS g
    ON g.instance = p.instance AND g.dp_rank = p.dp_rank AND g.epoch = p.epoch AND g.stream = p.stream
ORDER BY instance, dp_rank, epoch, stream

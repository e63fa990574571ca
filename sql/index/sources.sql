-- kvscope index cold start, step 2: each source's current epoch, last stored seq, model,
-- block size, newest engine timestamp, replaced epochs, and whether a gap after its last
-- clear leaves its state uncertain (stale).
WITH
-- include: bounded
,
events AS
(
    SELECT b.instance AS instance, b.dp_rank AS dp_rank, max(b.seq) AS last_seq,
           argMax(b.model, b._offset) AS model,
           argMaxIf(b.block_size, b._offset, b.event = 'stored') AS block_size,
           toFloat64(max(b.ts)) AS last_ts
    FROM bounded AS b
    INNER JOIN current AS c ON b.instance = c.instance AND b.dp_rank = c.dp_rank AND b.epoch = c.current_epoch
    GROUP BY b.instance, b.dp_rank
),
gaps AS
(
    SELECT g.instance AS instance, g.dp_rank AS dp_rank, max(g.seq) AS gap_seq,
           arrayStringConcat(groupArrayIf(
               concat('seqs ', toString(g.first_seq), '..', toString(g.last_seq), ' lost (',
                      g.reason, ')'),
               cl.has_clear = 0 OR g.seq > cl.clear_seq), '; ') AS reasons
    FROM bounded_gaps AS g
    INNER JOIN current AS c ON g.instance = c.instance AND g.dp_rank = c.dp_rank AND g.epoch = c.current_epoch
    LEFT JOIN cleared AS cl ON g.instance = cl.instance AND g.dp_rank = cl.dp_rank
    GROUP BY g.instance, g.dp_rank
)
SELECT c.instance AS instance, c.dp_rank AS dp_rank, c.current_epoch AS epoch, c.epochs AS epochs,
       greatest(e.last_seq, g.gap_seq) AS last_seq, e.model AS model,
       e.block_size AS block_size, e.last_ts AS last_ts, g.reasons AS stale_reason
FROM current AS c
LEFT JOIN events AS e ON c.instance = e.instance AND c.dp_rank = e.dp_rank
LEFT JOIN gaps AS g ON c.instance = g.instance AND c.dp_rank = g.dp_rank
ORDER BY instance, dp_rank

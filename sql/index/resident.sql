-- kvscope index cold start, step 3: the stored block events that make up every source's
-- resident blocks: those of its current epoch after its last clear, in seq order. The
-- index applies them with its own code (copies counted, a removal of a copy the source
-- does not hold changes nothing, a publisher retry's duplicate row skipped), so stored and
-- live state follow one rule set.
WITH
-- include: bounded
SELECT b.instance AS instance, b.dp_rank AS dp_rank, b.medium AS tier, b.block_hash AS block_hash,
       b.seq AS seq, b.event_index AS event_index, b.position AS position,
       toInt8(if(b.event = 'stored', 1, -1)) AS kind
FROM bounded AS b
INNER JOIN current AS c ON b.instance = c.instance AND b.dp_rank = c.dp_rank AND b.epoch = c.current_epoch
LEFT JOIN cleared AS cl ON b.instance = cl.instance AND b.dp_rank = cl.dp_rank
WHERE b.event != 'cleared'
  AND (cl.has_clear = 0 OR tuple(b.seq, b.event_index) > tuple(cl.clear_seq, cl.clear_event))
ORDER BY instance, dp_rank, seq, event_index, position

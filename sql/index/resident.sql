-- kvscope index cold start, step 3: every source's resident blocks per tier with their copy
-- counts, folded in seq order from the stored events of its current epoch after its last
-- clear (a removal of a copy the source does not hold changes nothing, as in the index).
-- Duplicates of a record (publisher retries) have the same (seq, event_index, position)
-- and count once.
WITH
-- include: bounded
SELECT b.instance AS instance, b.dp_rank AS dp_rank, b.medium AS tier, b.block_hash AS block_hash,
       arrayFold((acc, d) -> greatest(acc + d, 0),
                 arrayMap(x -> x.4, arraySort(groupUniqArray(
                     tuple(b.seq, b.event_index, b.position, if(b.event = 'stored', 1, -1))))),
                 toInt64(0)) AS copies
FROM bounded AS b
INNER JOIN current AS c ON b.instance = c.instance AND b.dp_rank = c.dp_rank AND b.epoch = c.epoch
LEFT JOIN cleared AS cl ON b.instance = cl.instance AND b.dp_rank = cl.dp_rank
WHERE b.event != 'cleared'
  AND (cl.has_clear = 0 OR tuple(b.seq, b.event_index) > tuple(cl.clear_seq, cl.clear_event))
GROUP BY b.instance, b.dp_rank, b.medium, b.block_hash
HAVING copies > 0
ORDER BY instance, dp_rank, tier

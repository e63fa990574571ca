-- The stored kv-events rows below the snapshot's positions (one per partition).
bounded AS
(
    SELECT * FROM kv_block_events
    WHERE _topic = {topic:String}
      AND indexOf({partitions:Array(UInt32)}, _partition) > 0
      AND _offset < {ends:Array(UInt64)}[indexOf({partitions:Array(UInt32)}, _partition)]
),
bounded_gaps AS
(
    SELECT * FROM stream_gaps
    WHERE _topic = {topic:String} AND stream = 'kv-events'
      AND indexOf({partitions:Array(UInt32)}, _partition) > 0
      AND _offset < {ends:Array(UInt64)}[indexOf({partitions:Array(UInt32)}, _partition)]
),
current AS
(
    -- each source's newest epoch (by Kafka position: one source lives in one partition)
    SELECT instance, dp_rank, argMax(epoch, _offset) AS current_epoch, groupUniqArray(epoch) AS epochs
    FROM (
        SELECT instance, dp_rank, epoch, _offset FROM bounded
        UNION ALL SELECT instance, dp_rank, epoch, _offset FROM bounded_gaps
    )
    GROUP BY instance, dp_rank
),
cleared AS
(
    -- the last AllBlocksCleared of the current epoch: state before it is gone
    SELECT b.instance AS instance, b.dp_rank AS dp_rank, 1 AS has_clear,
           argMax(b.seq, tuple(b.seq, b.event_index)) AS clear_seq,
           argMax(b.event_index, tuple(b.seq, b.event_index)) AS clear_event
    FROM bounded AS b
    INNER JOIN current AS c ON b.instance = c.instance AND b.dp_rank = c.dp_rank AND b.epoch = c.current_epoch
    WHERE b.event = 'cleared'
    GROUP BY b.instance, b.dp_rank
)

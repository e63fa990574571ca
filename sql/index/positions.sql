-- kvscope index cold start, step 1: where the stored prefix of each kv-events partition ends.
-- Every record below next_offset is stored (as block events, a gap or an ingest error):
-- the collector's inserts keep that prefix whole, so the index can load the state these
-- records give and go on reading Kafka from next_offset with nothing missed or doubled.
SELECT _partition AS partition, max(next) AS next_offset
FROM
(
    SELECT _partition, max(_offset) + 1 AS next FROM kv_block_events
    WHERE _topic = {topic:String} GROUP BY _partition
    UNION ALL
    SELECT _partition, max(_offset) + 1 AS next FROM stream_gaps
    WHERE _topic = {topic:String} GROUP BY _partition
    UNION ALL
    SELECT _partition, max(_offset) + 1 AS next FROM ingest_errors
    WHERE _topic = {topic:String} GROUP BY _partition
)
GROUP BY partition
ORDER BY partition

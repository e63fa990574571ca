-- kvscope migration 010: the latest progress of each source epoch, kept per part as an aggregate projection.
--
-- Every residency publish appends one kv_residency_progress row per source epoch it
-- derived, so the table grows with uptime: a collector refreshing every 10 s on 64 sources
-- adds ~550,000 rows a day. Each refresh read all of them three times (its plan, its
-- staged positions, its staged progress), and so did duplication and routing_opportunity:
-- after 30 days each such read took ~0.45 s, after a year several seconds, longer than the
-- refresh interval. Those reads ask only for each source epoch's latest values (argMax by
-- generation), its earliest first_ts, latest last_ts and the committed generation: this
-- projection stores them per part, merges combine them, and ClickHouse answers those
-- GROUP BYs from it in about the same time whatever the history (docs/benchmarks.md,
-- "Residency progress over uptime").
-- The progress rows are the commit marker (inserted last by a publish), so every row is
-- committed and the readers need no filter on generation, which would keep the projection
-- from being used. Materialized for the parts already written; rerunning both statements
-- changes nothing.
ALTER TABLE kv_residency_progress ADD PROJECTION IF NOT EXISTS latest
(
    SELECT
        instance, dp_rank, epoch,
        argMax(last_seq, generation), argMax(events, generation),
        argMax(removals, generation), argMax(clears, generation),
        argMax(first_ts, generation), argMax(last_ts, generation),
        min(first_ts), max(last_ts), max(generation)
    GROUP BY instance, dp_rank, epoch
);

ALTER TABLE kv_residency_progress MATERIALIZE PROJECTION latest SETTINGS mutations_sync = 1;

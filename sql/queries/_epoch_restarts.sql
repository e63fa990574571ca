-- Fragment, not a query: the source epochs a restart ended before `until`, for `-- include: epoch_restarts`.
-- Reads a CTE `epoch_starts` (instance, dp_rank, epoch, first_ts: the epoch's earliest block
-- event) that the including fragment defines. An engine restart is a new epoch of the same
-- instance and dp_rank, and it starts with an empty cache, but no event says so: a block
-- still resident in the old epoch has no event that ends it. So an epoch ends, here, when
-- the next epoch of its instance and dp_rank (in order of first_ts, then epoch: of two that
-- began at the same instant, the higher is the later one, as in `duplication`) has its first
-- block event, if that was before `until`. CTE `epoch_restarts`: one row per such epoch,
-- with that instant as restart_ts (an upper bound: the old engine stopped somewhere between
-- its own last event and then) and superseded = 1 (0 where a LEFT JOIN finds none).
epoch_restarts AS
(
    SELECT instance, dp_rank, epoch, restart_ts, toUInt8(1) AS superseded
    FROM
    (
        SELECT
            instance, dp_rank, epoch,
            leadInFrame(first_ts, 1, first_ts) OVER later AS restart_ts,
            leadInFrame(toUInt8(1), 1, toUInt8(0)) OVER later AS has_successor
        FROM epoch_starts
        WHERE first_ts < {until:DateTime64(6)}
        WINDOW later AS (
            PARTITION BY instance, dp_rank ORDER BY first_ts, epoch
            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
    )
    WHERE has_successor = 1
)

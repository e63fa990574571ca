"""The materialized residency equals the window-function definition, however it was built.

A simulated fleet's block events (with clears, and a second epoch made by replaying one
instance after a restart) are held back and released into `kv_block_events` in random
per-source prefixes; the residency is refreshed after each release with random step sizes,
sometimes through a fault injector that kills the refresh at its n-th statement (before
or after that statement lands). At the end the derived intervals must equal, row for row,
the window-function definition (`_block_intervals_raw.sql`) over the full history, and for
windows cut at random instants they must equal the full history's intervals restricted to
the window (carried in when resident at its start). A rebuild gives the same rows.
`routing_opportunity`, which reads the closed intervals from their block-hash-ordered copy
(`kv_block_intervals_by_hash`), must give the rows it gives over the definition. The same
holds for random event streams no simulator makes: removals of absent hashes, a hash twice
in one event, two media, timestamps that tie across sources and step back.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import threading
from typing import Any

import pytest
from kvscope.analytics.queries import (
    _read,
    _strip_comments,
    bind_params,
    fragment,
    list_queries,
    load_query,
    run_query,
    with_includes,
)
from kvscope.collector.storage import residency
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.tables import MIGRATIONS
from kvscope.collector.storage.target import connect, parse_target
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import FAR_FUTURE, explain_key_reads, simulate_direct

COLUMNS = (
    "instance, dp_rank, model, role, epoch, medium, block_hash, tokens, start_ts, end_kind, "
    "end_ts, refault, refault_distance, store_ord, removal_ord"
)
EPOCH_SHIFT_US = 3_600_000_000


class Crash(Exception):
    """The injected crash."""


class CrashingClient:
    """Fault injector (a fake by necessity: ClickHouse cannot be told to die between two
    statements of a refresh on demand). Passes every call to the real client and raises
    `Crash` at the n-th `command`, before it runs or right after it landed."""

    def __init__(self, client: Any, crash_at: int, after: bool) -> None:
        self.client = client
        self.crash_at = crash_at
        self.after = after
        self.calls = 0

    def command(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.crash_at and not self.after:
            raise Crash
        out = self.client.command(*args, **kwargs)
        if self.calls == self.crash_at:
            raise Crash
        return out

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.query(*args, **kwargs)


@pytest.fixture
def db(clickhouse: Any, clickhouse_url: str) -> Any:
    """The test database with kvscope's migrations applied."""
    migrate(clickhouse, parse_target(clickhouse_url))
    return clickhouse


def _intervals(client: Any, name: str, since: str, until: str) -> list[tuple]:
    sql = f"WITH {fragment(name)} SELECT {COLUMNS} FROM block_intervals"
    rows = client.query(sql, parameters={"since": since, "until": until, "model": ""})
    return sorted(rows.result_rows)


ROUTING_INTERVALS = """intervals AS
(
    SELECT cityHash64(instance, dp_rank) AS source_id, tokens, block_hash,
        toUInt8(start_ts < {since:DateTime64(6)}) AS carried_in,
        cityHash64(model, role, medium) AS group_key,
        toUnixTimestamp64Micro(start_ts) AS start_us, toUnixTimestamp64Micro(end_ts) AS end_us
    FROM block_intervals
)"""
"""routing_opportunity's `intervals` CTE over a `block_intervals` fragment (the reference)."""


def _routing(client: Any, since: str, until: str, name: str | None = None) -> list[tuple]:
    """routing_opportunity's rows for [since, until); with the fragment `name`, its intervals
    come from that `block_intervals` CTE instead of the by-hash table and kv_block_open."""
    sql = _strip_comments(load_query("routing_opportunity").sql)
    if name is not None:
        start, swept = sql.index("WITH\n") + len("WITH\n"), sql.index("swept AS")
        reference = f"{fragment(name)},\n{ROUTING_INTERVALS},\n"
        sql = sql[:start] + reference + sql[swept:]
    params = {"since": since, "until": until, "model": "", "instance": ""}
    rows = client.query(sql, parameters=params).result_rows
    return [tuple(None if v != v else v for v in row) for row in rows]  # NaN (0/0) as None


def _assert_routing_is_the_definitions(client: Any, windows: list[tuple[str, str]]) -> None:
    """routing_opportunity equals itself over the `block_intervals` fragment for each window
    (the fragment the tests check against the definition restricted to the window), and
    over the window-function definition itself for the full history."""
    everything = ("1970-01-01 00:00:00", FAR_FUTURE)
    assert _routing(client, *everything) == _routing(client, *everything, "block_intervals_raw")
    for since, until in windows:
        expected = _routing(client, since, until, "block_intervals")
        assert _routing(client, since, until) == expected, (since, until)


RAW_CTES = {
    "block_intervals": "block_intervals AS (SELECT *, toUInt8(0) AS carried_in FROM raw_intervals)",
    "stores_in_window": "stores AS (SELECT * FROM raw_intervals)",
}
"""The full history's `block_intervals` and `stores` from the definition (nothing is
carried in, every store is in the window)."""


EPOCHS_BEGAN = (
    "SELECT instance, dp_rank, epoch, min(first_ts), max(last_ts) FROM kv_residency_progress "
    "GROUP BY ALL ORDER BY ALL"
)
"""When each source epoch began (as `duplication` reads it) and ended, by the progress."""


def _fragment_users_over(client: Any, raw: bool) -> dict[str, list[tuple]]:
    """Rows of every query built on the `block_intervals` or `stores_in_window` fragment,
    over the full history; with `raw`, its intervals come from the window-function
    definition instead of the derived tables. Their t-digest quantiles are computed exactly
    here: an estimate depends on the order rows arrive in, which differs between the two
    (the estimators have their own tests against exact quantiles)."""

    def intervals_from_definition(name: str) -> str:
        if name not in RAW_CTES:
            return fragment(name)
        text = fragment("block_intervals_raw").replace("block_intervals AS", "raw_intervals AS", 1)
        return f"{text},\n{RAW_CTES[name]}"

    out = {}
    for query in list_queries():
        if not any(f"-- include: {name}\n" in _read(query.name) for name in RAW_CTES):
            continue
        sql = with_includes(_read(query.name), intervals_from_definition if raw else fragment)
        sql = re.sub(r"(quantiles?)TDigest", r"\1Exact", sql)
        params = bind_params(query, {"since": "1970-01-01 00:00:00", "until": FAR_FUTURE})
        rows = client.query(sql, parameters=params).result_rows
        out[query.name] = [tuple(None if v != v else v for v in row) for row in rows]  # NaN
    return out


def _hold_back(client: Any) -> list[tuple[str, int, int, int]]:
    """Move the raw block events to `held`, plus a restarted epoch of one instance and
    duplicate stores (vLLM's rare second copy of a resident hash) on another."""
    client.command("CREATE TABLE held AS kv_block_events ENGINE = MergeTree ORDER BY tuple()")
    client.command("INSERT INTO held SELECT * FROM kv_block_events")
    client.command(
        f"INSERT INTO held SELECT * REPLACE (epoch + 1 AS epoch, "
        f"ts + toIntervalMicrosecond({EPOCH_SHIFT_US}) AS ts) FROM kv_block_events "
        "WHERE instance = (SELECT min(instance) FROM kv_block_events)"
    )
    client.command(
        "INSERT INTO held SELECT * REPLACE (event_index + 100000 AS event_index) "
        "FROM kv_block_events WHERE event = 'stored' AND cityHash64(block_hash) % 40 = 0 "
        "AND instance = (SELECT max(instance) FROM kv_block_events)"
    )
    client.command("TRUNCATE TABLE kv_block_events")
    rows = client.query(
        "SELECT instance, dp_rank, epoch, max(seq) FROM held GROUP BY ALL ORDER BY ALL"
    ).result_rows
    return [(str(i), int(d), int(e), int(m)) for i, d, e, m in rows]


def _release(client: Any, sources: list, upto: dict, new: dict) -> None:
    """Insert each source's held events with seq in (upto, new] (a per-source prefix)."""
    for instance, dp_rank, epoch, _ in sources:
        key = (instance, dp_rank, epoch)
        if new[key] > upto.get(key, -1):
            client.command(
                "INSERT INTO kv_block_events SELECT * FROM held WHERE instance = {i:String} "
                "AND dp_rank = {d:UInt16} AND epoch = {e:UInt64} AND seq > {lo:Int64} "
                "AND seq <= {hi:Int64}",
                parameters={
                    "i": instance,
                    "d": dp_rank,
                    "e": epoch,
                    "lo": upto.get(key, -1),
                    "hi": new[key],
                },
            )


def _refresh(client: Any, rng: random.Random, crash_rate: float) -> bool:
    """One refresh, sometimes crashed at a random statement; True when it crashed."""
    max_records = rng.choice([1, 7, 50, 100_000])
    if rng.random() < crash_rate:
        crashing = CrashingClient(client, rng.randint(1, 17), rng.random() < 0.5)
        try:
            residency.refresh(crashing, max_records)
        except Crash:
            return True
    residency.refresh(client, max_records)
    return False


def _release_in_steps(
    client: Any, sources: list, rng: random.Random, releases: int, crash_rate: float
) -> int:
    """Release the held events in `releases` random per-source prefixes (the last one all
    of them), refreshing after each, sometimes crashed; then one more refresh, which
    finishes a crash of the last one (a no-op otherwise). Returns how many crashed."""
    upto: dict = {}
    crashes = 0
    for step in range(releases):
        new = {
            (i, d, e): m if step == releases - 1 else rng.randint(upto.get((i, d, e), -1), m)
            for i, d, e, m in sources
        }
        _release(client, sources, upto, new)
        upto = new
        crashes += _refresh(client, rng, crash_rate)
    residency.refresh(client)
    return crashes


def _restricted(full: list[tuple], since: str, until: str, client: Any) -> list[tuple]:
    """The full history's intervals restricted to [since, until) (the carry-in rule)."""
    lo, hi = client.query(
        "SELECT toDateTime64({s:String}, 6, 'UTC'), toDateTime64({u:String}, 6, 'UTC')",
        parameters={"s": since, "u": until},
    ).result_rows[0]
    out = []
    for row in full:
        start, kind, end = row[8], row[9], row[10]
        if start >= hi or (kind != "open" and end < lo):
            continue
        if kind == "open" or end >= hi:
            row = (*row[:9], "open", hi, *row[11:])
        out.append(row)
    return sorted(out)


def _cut_points(client: Any, rng: random.Random, n: int) -> list[str]:
    """`n` random instants from a little before the first event to after the last."""
    lo, hi = client.query("SELECT min(ts), max(ts) FROM held").result_rows[0]
    span = (hi - lo).total_seconds()
    return [
        (lo + dt.timedelta(seconds=rng.uniform(-0.05, 1.05) * span)).strftime(
            "%Y-%m-%d %H:%M:%S.%f"
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    ("instances", "workload", "resets", "releases", "crash_rate", "seed"),
    [
        ("3", "multi-turn", (("engine-1", 6.0),), 1, 0.0, 1),
        ("3", "multi-turn", (("engine-1", 6.0), ("engine-2", 9.0)), 9, 0.5, 2),
        ("2p,2d", "zipf", (("prefill-0", 4.0),), 5, 0.3, 3),
        ("1p,1d,1b", "generated-shared-prefix", (("engine-0", 5.0),), 17, 0.6, 4),
    ],
)
def test_materialized_equals_definition(
    db: Any,
    instances: str,
    workload: str,
    resets: tuple,
    releases: int,
    crash_rate: float,
    seed: int,
) -> None:
    config = SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        routing="random",
        requests=300,
        capacity_blocks=200,
        seed=seed,
        resets=resets,
    )
    simulate_direct(db, config)
    sources = _hold_back(db)
    rng = random.Random(seed)
    crashes = _release_in_steps(db, sources, rng, releases, crash_rate)
    assert crashes > 0 or crash_rate == 0
    full = _intervals(db, "block_intervals_raw", "1970-01-01 00:00:00", FAR_FUTURE)
    assert {r[9] for r in full} == {"removed", "cleared", "restored", "restarted", "open"}
    assert len({r[4] for r in full}) > len({r[0] for r in full}), "a second epoch"
    assert _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE) == full
    windows = [tuple(sorted(_cut_points(db, rng, 2))) for _ in range(6)]
    for since, until in windows:
        got = _intervals(db, "block_intervals", since, until)
        assert got == _restricted(full, since, until, db), (since, until)
    everything = ("1970-01-01 00:00:00", FAR_FUTURE)
    roles = [spec.role for spec in config.instances]
    if len(set(roles)) < len(roles):  # two sources that could share; a restart shares nothing
        assert sum(row[3] for row in _routing(db, *everything)) > 0, "no routing opportunity"
    _assert_routing_is_the_definitions(db, windows)
    residency.rebuild(db, max_records=rng.choice([5, 100_000]))
    assert _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE) == full
    _assert_routing_is_the_definitions(db, windows[:1])


def _random_stream_rows(rng: random.Random, hashes: int, records: int) -> list[tuple]:
    """`kv_block_events` rows (every column, in the table's order) of streams no engine or
    simulator would publish, but that the derivation must still get right. Per source
    (three instances of two models, two dp ranks, one or two odd epochs, as `_hold_back`
    adds epoch + 1): random stores and removals of hashes from a small pool (removals of
    hashes not resident, stores of hashes already resident, several hashes per event, one
    hash twice in an event), rare clears, two media, and timestamps on a coarse clock that
    tie across sources and now and then step back."""
    pool = [rng.getrandbits(64) for _ in range(hashes)]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows: list[tuple] = []
    offset = 0
    for instance, model, role in (("a", "m", "prefill"), ("b", "m", "decode"), ("c", "n", "both")):
        for dp_rank in (0, 1):
            for epoch in (1, 3)[: rng.randint(1, 2)]:
                ts = start + dt.timedelta(seconds=10 * epoch)
                for seq in range(rng.randint(1, records)):
                    step_ms = rng.choice((0, 0, 1, 3, 10, -5)) if seq else 0
                    ts += dt.timedelta(milliseconds=step_ms)
                    for event_index in range(rng.randint(1, 4)):
                        kind = rng.choices(("stored", "removed", "cleared"), (10, 7, 1))[0]
                        medium = "" if kind == "cleared" else rng.choice(("GPU", "GPU", "CPU"))
                        picked = (
                            [0] if kind == "cleared" else rng.choices(pool, k=rng.randint(1, 4))
                        )
                        for position, block_hash in enumerate(picked):
                            stored = kind == "stored"
                            rows.append((
                                instance, dp_rank, model, role, "vllm", epoch, seq, ts,
                                event_index, position, kind, block_hash,
                                0 if position else rng.choice(pool), 16 if stored else 0,
                                rng.randint(1, 16) if stored else 0, medium, medium, "", -1,
                                "kv-events", 0, offset,
                            ))  # fmt: skip
                    offset += 1
    return rows


@pytest.mark.parametrize(
    ("seed", "hashes", "records", "releases", "crash_rate"),
    [(11, 6, 40, 4, 0.5), (105, 4, 40, 5, 0.0), (13, 60, 150, 3, 0.0), (143, 4, 120, 8, 0.4)],
)
def test_materialized_equals_definition_on_random_streams(
    db: Any, seed: int, hashes: int, records: int, releases: int, crash_rate: float
) -> None:
    """Released in random prefixes, refreshed with random step sizes and crashes, random
    streams (`_random_stream_rows`) derive exactly the definition's intervals, for the full
    history and windows cut at random instants, before and after a rebuild, and
    `routing_opportunity` and every query on the `block_intervals` fragment give the rows
    they give over the definition; `duplication` (which also reads the sources' progress)
    gives what a rebuild in one step gives."""
    rng = random.Random(seed)
    db.insert("kv_block_events", _random_stream_rows(rng, hashes, records))
    sources = _hold_back(db)
    _release_in_steps(db, sources, rng, releases, crash_rate)
    everything = ("1970-01-01 00:00:00", FAR_FUTURE)
    full = _intervals(db, "block_intervals_raw", *everything)
    assert {r[9] for r in full} == {"removed", "cleared", "restored", "restarted", "open"}
    assert _intervals(db, "block_intervals", *everything) == full
    windows = [tuple(sorted(_cut_points(db, rng, 2))) for _ in range(8)]
    for since, until in windows:
        got = _intervals(db, "block_intervals", since, until)
        assert got == _restricted(full, since, until, db), (since, until)
    _assert_routing_is_the_definitions(db, windows)
    derived = _fragment_users_over(db, raw=False)
    assert {"residency", "refaults", "capacity_what_if"} <= set(derived)
    assert derived == _fragment_users_over(db, raw=True)
    duplication = [run_query(db, "duplication", {"until": u}) for _, u in windows]
    began = db.query(EPOCHS_BEGAN).result_rows
    residency.rebuild(db, max_records=100_000)
    assert _intervals(db, "block_intervals", *everything) == full
    assert [run_query(db, "duplication", {"until": u}) for _, u in windows] == duplication
    assert db.query(EPOCHS_BEGAN).result_rows == began


def test_rebuild_crashed_at_any_statement_is_finished_by_the_next_refresh(db: Any) -> None:
    """A rebuild killed at any of its statements (before or after it lands), including
    while it empties the derived tables, never leaves a committed generation over
    half-emptied tables: the next refresh gives the definition's rows again."""
    resets = (("engine-1", 3.0),)
    sim = SimConfig(instances=parse_instances("2"), requests=120, seed=8, resets=resets)
    simulate_direct(db, sim)
    residency.refresh(db)
    full = _intervals(db, "block_intervals_raw", "1970-01-01 00:00:00", FAR_FUTURE)
    assert _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE) == full
    counting = CrashingClient(db, crash_at=0, after=False)
    residency.rebuild(counting, max_records=50)
    statements = counting.calls
    truncates = len(residency._statements("truncate_stage"))
    truncates += len(residency._statements("truncate_derived"))
    points = list(range(1, truncates + 3))
    points += random.Random(8).sample(range(truncates + 3, statements + 1), 4)
    for crash_at in points:
        for after in (False, True):
            with pytest.raises(Crash):
                residency.rebuild(CrashingClient(db, crash_at, after), max_records=50)
            residency.refresh(db)
            got = _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE)
            assert got == full, (crash_at, after, statements)
            _assert_routing_is_the_definitions(db, [])


def test_refresh_is_idle_when_current_and_queries_carry_blocks_in(db: Any) -> None:
    """A second refresh derives nothing; a window starting mid-run still sees residents."""
    config = SimConfig(instances=parse_instances("2"), requests=200, capacity_blocks=150, seed=5)
    simulate_direct(db, config)
    first = residency.refresh(db)
    assert first.events == db.command("SELECT count() FROM kv_block_events") > 0
    assert residency.refresh(db).generations == 0
    lo, hi = db.query("SELECT min(ts), max(ts) FROM kv_block_events").result_rows[0]
    middle = lo + (hi - lo) / 2
    rows = run_query(db, "residency", {"since": middle, "until": FAR_FUTURE})
    carried = db.command(
        "SELECT count() FROM kv_block_intervals WHERE start_ts < {m:DateTime64(6)} "
        "AND end_ts >= {m:DateTime64(6)}",
        parameters={"m": middle},
    ) + db.command(
        "SELECT count() FROM kv_block_open FINAL WHERE start_ts < {m:DateTime64(6)}",
        parameters={"m": middle},
    )
    stored_after = db.command(
        "SELECT count() FROM kv_block_events WHERE event = 'stored' AND ts >= {m:DateTime64(6)}",
        parameters={"m": middle},
    )
    assert carried > 0
    assert sum(r["intervals"] for r in rows) == carried + stored_after
    refaults = run_query(db, "refaults", {"since": middle, "until": FAR_FUTURE})
    assert sum(r["stores"] for r in refaults) == stored_after


def test_derive_command(db: Any, clickhouse_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvscope derive` derives what is new, `--rebuild` everything; bad input exits 1."""
    from kvscope.cli.main import main

    simulate_direct(db, SimConfig(instances=parse_instances("2"), requests=60, seed=6))
    events = db.command("SELECT count() FROM kv_block_events")
    assert main(["derive", "--clickhouse", clickhouse_url, "--max-records", "10"]) == 0
    first = capsys.readouterr().out
    assert f"{events:,} block events of 2 source-epochs" in first
    assert main(["derive", "--clickhouse", clickhouse_url]) == 0
    assert "0 block events of 0 source-epochs in 0 steps" in capsys.readouterr().out
    before = _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE)
    assert main(["derive", "--clickhouse", clickhouse_url, "--rebuild"]) == 0
    assert f"{events:,} block events" in capsys.readouterr().out
    assert _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE) == before
    assert main(["derive", "--clickhouse", clickhouse_url, "--max-records", "0"]) == 2
    assert "--max-records must be >= 1" in capsys.readouterr().err


def test_interval_queries_skip_the_hours_before_the_window(db: Any) -> None:
    """Every query reading the closed intervals (kv_block_intervals, or its by-hash copy)
    lets its primary key (hour of end_ts) skip what ended before `since`: a one-hour window
    must not read the whole history."""
    simulate_direct(
        db, SimConfig(instances=parse_instances("2"), requests=150, seed=3, capacity_blocks=100)
    )
    residency.refresh(db)
    lo, hi = db.query("SELECT min(ts), max(ts) FROM kv_block_events").result_rows[0]
    window = {"since": lo + (hi - lo) / 2, "until": hi}
    users = [q for q in list_queries() if re.search(r"FROM kv_block_intervals(_by_hash)?\b", q.sql)]
    assert {"residency", "refaults", "routing_opportunity", "capacity_what_if"} <= {
        q.name for q in users
    }
    for q in users:
        params = bind_params(q, {k: v for k, v in window.items() if k in q.params})
        intervals = ("kv_block_intervals", "kv_block_intervals_by_hash")
        reads = [r for r in explain_key_reads(db, q.sql, params) if r.table in intervals]
        assert reads, f"{q.name}: no read of the closed intervals in its plan"
        for read in reads:
            assert "toStartOfHour(end_ts)" in read.condition, (
                f"{q.name}: primary key unused: {read.condition}"
            )


class CrashAfterIntervalsPublish(CrashingClient):
    """Fault injector (a fake by necessity, as `CrashingClient`): dies right after the
    publish of kv_block_intervals landed, before the rest of the generation's publish."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, crash_at=0, after=True)

    def command(self, statement: str, *args: Any, **kwargs: Any) -> Any:
        out = self.client.command(statement, *args, **kwargs)
        if statement.startswith("INSERT INTO kv_block_intervals SELECT"):
            raise Crash
        return out


@pytest.mark.parametrize("interrupted", [False, True])
def test_migration_009_copies_the_committed_intervals(
    db: Any, clickhouse_url: str, interrupted: bool
) -> None:
    """A database derived before migration 009 has residency but no by-hash copy of it: the
    migration copies the committed closed intervals, so routing_opportunity reads the whole
    history at once. A generation whose publish a crash interrupted (its intervals landed,
    not its progress) is not copied: the refresh that finishes it writes it, once."""
    everything = ("1970-01-01 00:00:00", FAR_FUTURE)
    sim = SimConfig(instances=parse_instances("3"), requests=150, seed=9, capacity_blocks=100)
    simulate_direct(db, sim)
    held = _hold_back(db)
    half = {(i, d, e): m // 2 for i, d, e, m in held}
    _release(db, held, {}, half)
    residency.refresh(db)
    _release(db, held, half, {(i, d, e): m for i, d, e, m in held})
    if interrupted:
        with pytest.raises(Crash):
            residency.refresh(CrashAfterIntervalsPublish(db))
    db.command("TRUNCATE TABLE kv_block_intervals_by_hash")  # as when 009 created it
    db.command(f"ALTER TABLE {MIGRATIONS} DELETE WHERE version = 9 SETTINGS mutations_sync = 1")
    committed = db.command("SELECT max(generation) FROM kv_residency_progress")
    assert migrate(db, parse_target(clickhouse_url)) == [9]
    copied = db.command("SELECT count() FROM kv_block_intervals_by_hash")
    closed = "SELECT count() FROM kv_block_intervals WHERE generation <= {g:UInt64}"
    assert copied == db.command(closed, parameters={"g": committed}) > 0
    if not interrupted:
        assert _routing(db, *everything) == _routing(db, *everything, "block_intervals")
    residency.refresh(db)
    assert db.command("SELECT count() FROM kv_block_intervals_by_hash") == db.command(
        "SELECT count() FROM kv_block_intervals"
    )
    expected = _routing(db, *everything, "block_intervals_raw")
    assert sum(row[3] for row in expected) > 0
    _assert_routing_is_the_definitions(db, [tuple(sorted(_cut_points(db, random.Random(9), 2)))])


def test_refreshes_at_once_take_turns(db: Any, clickhouse_url: str) -> None:
    """Two refreshes at once in one process, on two clients of the database (a collector's
    refresher and a query's, as in `kvscope demo`), take turns: they share the stage
    tables, so together they would publish every interval twice. Each is derived once."""
    sim = SimConfig(instances=parse_instances("3"), requests=150, seed=5, capacity_blocks=100)
    simulate_direct(db, sim)
    clients = [db, connect(parse_target(clickhouse_url))]
    start = threading.Barrier(len(clients))
    failures: list[BaseException] = []

    def derive(client: Any) -> None:
        try:
            start.wait()
            residency.refresh(client, max_records=50)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=derive, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    full = _intervals(db, "block_intervals_raw", "1970-01-01 00:00:00", FAR_FUTURE)
    assert _intervals(db, "block_intervals", "1970-01-01 00:00:00", FAR_FUTURE) == full
    assert db.command("SELECT count() FROM kv_block_intervals_by_hash") == db.command(
        "SELECT count() FROM kv_block_intervals"
    )

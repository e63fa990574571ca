"""Times read alike everywhere (query params, report flags, the API) and CSV line ends."""

from __future__ import annotations

import datetime as dt

import pytest
from kvscope.analytics.queries import bind_params, format_rows, load_query
from kvscope.analytics.times import EARLIEST, LATEST, parse_time, whole_minute_before
from kvscope.schemas.errors import ConfigError

NOW = dt.datetime(2026, 11, 23, 6, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("30s", NOW - dt.timedelta(seconds=30)),
        ("15m", NOW - dt.timedelta(minutes=15)),
        ("2h", NOW - dt.timedelta(hours=2)),
        ("1.5d", NOW - dt.timedelta(days=1.5)),
        ("1767225600", dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
        ("1767225600.5", dt.datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=dt.UTC)),
        ("2026-11-21T09:00:00", dt.datetime(2026, 11, 21, 9, tzinfo=dt.UTC)),
        ("2026-11-21T09:00:00Z", dt.datetime(2026, 11, 21, 9, tzinfo=dt.UTC)),
        ("2026-11-21T10:00:00+01:00", dt.datetime(2026, 11, 21, 9, tzinfo=dt.UTC)),
        ("20261121", dt.datetime(2026, 11, 21, tzinfo=dt.UTC)),
        ("12345678", dt.datetime(1970, 5, 23, 21, 21, 18, tzinfo=dt.UTC)),
        ("0001-01-01", EARLIEST),
        ("0001-01-01T00:00:00+01:00", EARLIEST),
        ("1899-12-31T23:59:59", EARLIEST),
        ("100000d", EARLIEST),
        ("2300-01-01", LATEST),
        ("9999-12-31T23:59:59-01:00", LATEST),
    ],
)
def test_parse_time(text: str, expected: dt.datetime) -> None:
    assert parse_time(text, now=NOW) == expected


@pytest.mark.parametrize(
    "text", ["yesterday", "2h ago", "-5m", "", "99999999999999999999", "99999999d", "9" * 400 + "h"]
)
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="cannot read time"):
        parse_time(text, now=NOW)


@pytest.mark.parametrize(
    "text", ["20261121", "20261121T0930", "1767225600", "2026-11-21T10:00:00+01:00", "12345678"]
)
def test_query_params_read_times_as_the_report_does(text: str) -> None:
    bound = bind_params(load_query("hit_rate"), {"since": text})["since"]
    assert bound == parse_time(text).astimezone(dt.UTC).replace(tzinfo=None)


@pytest.mark.parametrize(
    "params",
    [
        {"since": "1h", "until": "2h"},
        {"since": "2026-01-01", "until": "2026-01-01T00:00:00Z"},
        {"since": "2100-01-01"},
    ],
)
def test_a_window_that_ends_before_it_starts_is_refused(params: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"since \(.*\) must be before until"):
        bind_params(load_query("hit_rate"), params)


@pytest.mark.parametrize("since", ["2h", "7200s", "120m"])
def test_query_params_take_durations_like_report(since: str) -> None:
    bound = bind_params(load_query("hit_rate"), {"since": since})
    expected = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(hours=2)
    assert abs((bound["since"] - expected).total_seconds()) < 60


@pytest.mark.parametrize(
    "name,param", [("eviction_churn_timeline", "bucket_s"), ("request_hit_rate", "limit")]
)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_zero_buckets_and_limits_are_refused(name: str, param: str, value: str) -> None:
    query = load_query(name)
    if param not in query.params:
        pytest.fail(f"{name} has no parameter {param}: {sorted(query.params)}")
    with pytest.raises(ConfigError, match=param):
        bind_params(query, {param: value})


@pytest.mark.parametrize("value", ["-1", "1e30", "nan", "inf", "0.5,-0.1", "0.5,2000"])
def test_what_if_fractions_out_of_range_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"fractions: .* from 0 to 1000"):
        bind_params(load_query("capacity_what_if"), {"fractions": value})


@pytest.mark.parametrize(
    "value,expected",
    [("0", [0.0]), ("0.5,2", [0.5, 2.0]), ("1000", [1000.0]), ("0.5,2,0.50,2", [0.5, 2.0])],
)
def test_what_if_fractions_in_range_are_kept(value: str, expected: list[float]) -> None:
    assert (
        bind_params(load_query("capacity_what_if"), {"fractions": value})["fractions"] == expected
    )


@pytest.mark.parametrize("rows", [1, 3, 10])
def test_csv_ends_lines_with_newline_only(rows: int) -> None:
    text = format_rows([{"a": i, "b": f"x{i}"} for i in range(rows)], "csv")
    assert "\r" not in text
    assert text.count("\n") == rows + 1


@pytest.mark.parametrize("now", [1767225600.0, 1767225617.3, 1767225659.999, 1767229999.5])
@pytest.mark.parametrize("last_arrival_s", [0.0, 19.0, 61.5, 1500.0])
def test_a_simulated_run_starts_at_a_whole_minute_ending_before_now(
    now: float, last_arrival_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start followed the wall clock to the second, so the per-minute buckets cut one
    seed's run at different points on every run and its series differed."""
    import types

    from kvscope.cli.commands import simulate

    monkeypatch.setattr(simulate.time, "time", lambda: now)
    start = simulate.start_ending_now([types.SimpleNamespace(arrival_s=last_arrival_s)])
    assert start % 60 == 0
    ahead = now - (start + last_arrival_s)
    assert simulate.END_MARGIN_S <= ahead < simulate.END_MARGIN_S + 60
    assert whole_minute_before(now) <= now < whole_minute_before(now) + 60

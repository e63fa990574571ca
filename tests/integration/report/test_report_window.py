"""The report's window is the data present: `--since 2h` on seconds of data is seconds.

It said caches filled "2:00:32 into" a 0:00:19 window and that the halves disagreed (the
first half had no data): the rates used the data's span, warm-up and halves `--since`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kvscope.analytics.report import planner
from kvscope.analytics.report.build import build_report
from kvscope.analytics.report.layout import layout
from kvscope.analytics.report.markdown import render_markdown
from kvscope.analytics.report.model import HalfFigures
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.simulator.fleet import SimConfig, parse_instances
from support.analytics_kit import simulate_direct

START = 1767225600.0


@pytest.mark.parametrize("before", [timedelta(hours=2)])
def test_a_window_wider_than_the_data_is_measured_over_the_data(
    clickhouse: Any, clickhouse_url: str, tmp_path: Path, before: timedelta
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(
        instances=parse_instances("2"), capacity_blocks=60, requests=120, rate=6.0, seed=4
    )
    simulate_direct(clickhouse, config)
    since = datetime.fromtimestamp(START, UTC) - before
    report, _ = build_report(target, tmp_path, since=since, client=clickhouse)
    fleet, doubt = report.fleet, report.uncertainty
    assert doubt is not None and fleet.start is not None and fleet.end is not None
    assert report.since == fleet.start
    assert report.until == fleet.end + timedelta(microseconds=1)
    span = (fleet.end - fleet.start).total_seconds()
    assert span < 60  # 120 requests at 6 per second
    assert doubt.window_s == pytest.approx(span, abs=1e-3)
    assert doubt.warm_up_s is not None and doubt.warm_up_s <= span + 60
    assert not any("filled only" in w for w in doubt.warnings), doubt.warnings
    assert [h.hit_rate is not None for h in doubt.halves] == [True, True]
    assert doubt.halves[0].since == report.since and doubt.halves[1].until == report.until


@pytest.mark.parametrize("empty", [0, 1])
def test_an_empty_half_says_no_data_and_is_not_a_disagreement(
    sample_report: Any, empty: int
) -> None:
    t = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
    halves = [HalfFigures(t, t + timedelta(minutes=1), 0.5, 0.25) for _ in range(2)]
    halves[empty] = HalfFigures(halves[empty].since, halves[empty].until, None, None)
    doubt = planner.uncertainty(sample_report.capacity, t, 10.0, halves)
    assert doubt.stable is None
    assert not any("moves with the window" in w for w in doubt.warnings)
    report = msgspec.structs.replace(sample_report, uncertainty=doubt)
    text = render_markdown(report, layout(report, set()), "images")
    name = ("First half", "Second half")[empty]
    assert f"{name} (" in text and "): no data." in text
    assert "halves disagree" not in text and "halves agree" not in text


@pytest.mark.parametrize(
    ("workload", "instances", "capacity"),
    [("generated-shared-prefix", "2", 90)],
)
def test_halves_cannot_both_need_more_than_the_whole(
    clickhouse: Any,
    clickhouse_url: str,
    tmp_path: Path,
    workload: str,
    instances: str,
    capacity: int,
) -> None:
    """Halves replayed from cold caches needed +70% and +65% where the whole needed +60%.
    Replayed from the state at their start, the two halves' replays add up to the whole's,
    so where the whole just reaches the target, one half at least does too."""
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    config = SimConfig(
        instances=parse_instances(instances),
        workload=workload,
        capacity_blocks=capacity,
        requests=240,
        rate=2.0,
        seed=6,
    )
    simulate_direct(clickhouse, config)
    first, _ = build_report(target, tmp_path / "a", client=clickhouse)
    point = next(p for p in first.capacity.curve if p.fraction == 0.5)
    aim = point.hit_rate - 1e-6  # the whole reaches it at +50% (or before)
    report, _ = build_report(target, tmp_path / "b", target_hit_rate=aim, client=clickhouse)
    whole = report.capacity.fraction_for_target
    doubt = report.uncertainty
    assert doubt is not None and whole is not None and whole <= 0.5
    needed = [h.fraction_for_target for h in doubt.halves]
    assert any(n is not None and n <= whole for n in needed), (needed, whole)

"""`kvscope report` flags: time parsing, and a clear error when the window holds no data."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from kvscope.analytics.report.build import build_report
from kvscope.cli.commands.report import parse_time
from kvscope.collector.storage.migrate import migrate
from kvscope.collector.storage.target import parse_target
from kvscope.schemas.errors import ConfigError

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T09:00:00", datetime(2026, 11, 21, 9, 0, tzinfo=UTC)),
        ("2026-11-21T10:00:00+01:00", datetime(2026, 11, 21, 9, 0, tzinfo=UTC)),
        ("30m", datetime(2026, 11, 21, 9, 30, tzinfo=UTC)),
        ("2h", datetime(2026, 11, 21, 8, 0, tzinfo=UTC)),
        ("1.5d", datetime(2026, 11, 19, 22, 0, tzinfo=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text, now=NOW) == expected


def test_parse_time_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="ISO 8601"):
        parse_time("yesterday", now=NOW)


def test_empty_window_says_what_to_do(
    clickhouse: object, clickhouse_url: str, tmp_path: Path
) -> None:
    target = parse_target(clickhouse_url)
    migrate(clickhouse, target)
    with pytest.raises(ConfigError, match="no kvscope data in this window for model 'm'"):
        build_report(target, tmp_path, model="m", client=clickhouse)
    assert not (tmp_path / "report.html").exists()

"""Reading times the same way everywhere: ISO 8601, epoch seconds, or a duration ago.

`kvscope query --param since=2h`, `kvscope report --since 2h` and the serve's API all
read times through `parse_time`, so one spelling works in every place.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from kvscope.schemas.errors import ConfigError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_EPOCH = re.compile(r"^\d+(?:\.\d+)?$")
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(2299, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
"""The range of ClickHouse's DateTime64: no stored time lies outside, and ClickHouse cannot
read a parameter outside (year 1 was an error), so a time beyond it is read as its end."""


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """A UTC-aware time from ISO 8601 (UTC unless it says otherwise; `Z` allowed), epoch
    seconds (`1763800000`), or a duration ago (`30s`, `30m`, `2h`, `7d`). ISO 8601 comes
    before epoch seconds: `20261125` is 2026-11-25 (ISO's basic form), not 1970-08-23.
    Times before `EARLIEST` or after `LATEST` are read as these."""
    text = str(text).strip()
    match = _DURATION.match(text)
    try:
        if match:
            ago = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
            value = (now or datetime.now(UTC)) - ago
        else:
            try:
                value = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                if not _EPOCH.match(text):
                    raise
                value = datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError, OSError):
        raise ConfigError(
            f"cannot read time {text!r}: use ISO 8601 (2026-11-21T09:00:00), epoch seconds, "
            "or a duration ago like 30m, 2h, 7d"
        ) from None
    return min(max(value if value.tzinfo else value.replace(tzinfo=UTC), EARLIEST), LATEST)


def whole_minute_before(ts: float) -> float:
    """The epoch second of the whole minute at or before `ts`. A simulated run starting there
    is cut into the same per-minute buckets whenever it runs (the queries' buckets start at
    whole minutes), so one seed gives one series."""
    return 60.0 * (ts // 60)

"""`RepeatFilter`: one line per kind of repeated message per window, with the count dropped."""

from __future__ import annotations

import logging

import pytest
from kvscope.common.logs import AIOKAFKA_LOGGERS, MAX_KEYS, RepeatFilter, quiet_aiokafka


def _record(msg: str, name: str = "aiokafka", level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("x",), None)


@pytest.mark.parametrize("repeats", [1, 10, 1000])
def test_repeats_are_dropped_within_the_window_and_counted_after(repeats: int) -> None:
    now = [0.0]
    throttle = RepeatFilter(window_s=60.0, clock=lambda: now[0])
    passed = [throttle.filter(_record("Unable connect to %s")) for _ in range(repeats)]
    assert passed == [True] + [False] * (repeats - 1)
    assert throttle.filter(_record("another template %s"))
    assert throttle.filter(_record("Unable connect to %s", level=logging.WARNING))
    now[0] = 61.0
    record = _record("Unable connect to %s")
    assert throttle.filter(record)
    if repeats > 1:
        assert f"[{repeats - 1} more like this in the last 60 s]" in record.getMessage()
    else:
        assert record.getMessage() == "Unable connect to x"


def test_memory_is_bounded() -> None:
    throttle = RepeatFilter()
    for i in range(3 * MAX_KEYS):
        assert throttle.filter(_record(f"template {i}"))
    assert len(throttle._seen) <= MAX_KEYS


def test_quiet_aiokafka_installs_one_filter_per_logger() -> None:
    quiet_aiokafka()
    quiet_aiokafka()
    for name in AIOKAFKA_LOGGERS:
        filters = [f for f in logging.getLogger(name).filters if isinstance(f, RepeatFilter)]
        assert len(filters) == 1

"""The SLO and target-share readers shared by `kvscope report`, `query --param` and /report."""

from __future__ import annotations

import pytest
from kvscope.analytics.numbers import milliseconds, share


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("50", 50.0), (" 2.5 ", 2.5), (7, 7.0)])
def test_milliseconds_of_at_least_0(text: object, value: float) -> None:
    assert milliseconds(text) == value


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "-inf", "", "50ms", None])
def test_milliseconds_refused(text: object) -> None:
    with pytest.raises(ValueError, match="give a number of milliseconds of at least 0"):
        milliseconds(text)


@pytest.mark.parametrize(
    ("text", "value"), [("0.7", 0.7), ("70%", 0.7), (" 1% ", 0.01), ("100%", 1.0), ("1", 1.0)]
)
def test_share_as_fraction_or_percent(text: str, value: float) -> None:
    assert share(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "0%", "101%", "1.01", "nan", "inf", "%", "seventy"])
def test_share_refused(text: str) -> None:
    with pytest.raises(ValueError, match="give a share between 0 and 1"):
        share(text)

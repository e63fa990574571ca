"""The numbers people type for the report and the queries (an SLO, a target hit rate),
read alike by `kvscope report`, `kvscope query --param` and the serve's API."""

from __future__ import annotations

import math
from typing import Any


def milliseconds(value: Any) -> float:
    """`value` as a finite number of milliseconds of at least 0 (an SLO; 0 makes every
    transfer a breach), else ValueError saying what to give."""
    number = _float(value)
    if not 0 <= number < math.inf:
        raise ValueError("give a number of milliseconds of at least 0")
    return number


def share(value: Any) -> float:
    """`value` as a share above 0 and at most 1, a fraction or a percentage (`70%`), else
    ValueError saying what to give."""
    text = str(value).strip()
    number = _float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    if not 0 < number <= 1:
        raise ValueError("give a share between 0 and 1 (or 1%-100%)")
    return number


def _float(value: Any) -> float:
    """`value` as a float; nan when it is none (the range checks then refuse it)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan

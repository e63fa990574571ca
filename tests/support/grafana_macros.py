"""Expand a Grafana ClickHouse panel's SQL the way Grafana and the plugin do, for chDB tests.

Grafana first interpolates dashboard variables (`${name:sqlstring}`: the value with `'`
doubled, in single quotes, like Grafana's sqlstring format); the ClickHouse data source
plugin then replaces its macros (`$__fromTime_ms` -> `fromUnixTimestamp64Milli(ms)`, as in
the plugin's pkg/macros/macros.go). Only the macros and variable formats kvscope's
dashboards use are known; any other `$...` or `{name:Type}` left over fails the test.
"""

from __future__ import annotations

import datetime as dt
import re

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([a-z]+))?\}")
_LEFTOVER = re.compile(r"\$\{|\$__[A-Za-z_]+|\{[A-Za-z_][A-Za-z0-9_]*:[^}]+\}")


def _sqlstring(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def expand(
    sql: str,
    *,
    start: dt.datetime,
    end: dt.datetime,
    variables: dict[str, str],
) -> str:
    """`sql` with variables and the plugin's macros replaced; raises on anything unknown."""

    def variable(match: re.Match[str]) -> str:
        name, fmt = match.group(1), match.group(2)
        if fmt != "sqlstring":
            raise AssertionError(f"${{{name}}} without the :sqlstring format is not quoted")
        return _sqlstring(variables[name])

    def ms(stamp: dt.datetime) -> str:
        return f"fromUnixTimestamp64Milli({int(stamp.timestamp() * 1000)})"

    out = _VARIABLE.sub(variable, sql)
    out = out.replace("$__fromTime_ms", ms(start)).replace("$__toTime_ms", ms(end))
    leftover = _LEFTOVER.search(out)
    if leftover:
        raise AssertionError(f"unexpanded {leftover.group(0)!r} in panel SQL")
    return out

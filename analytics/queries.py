"""The SQL analytics in `sql/queries/`: list them, load them, run them with parameters.

A query file's first comment line is its one-line description; the `-- Parameters:` line
names its ClickHouse query parameters (`{since:DateTime64(6)}`, ...). Files starting with
`_` are fragments: a line `-- include: NAME` in a query (or in a fragment) is replaced by
`_NAME.sql`.
`run_query(client, name, params)` fills in defaults for the common parameters, binds the
rest server-side (never by string formatting), brings the materialized residency up to
date when the query reads it, and returns a list of row dicts (for `capacity_what_if`,
refined by `whatif.refine` with the access replay);
`format_rows` renders them as a table, JSON (an array of objects) or CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import importlib.resources
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvscope.analytics.numbers import milliseconds
from kvscope.analytics.times import parse_time
from kvscope.cachemodel.whatif import WHAT_IF_FRACTIONS
from kvscope.collector.storage import residency, tables
from kvscope.collector.storage.client import Client
from kvscope.schemas.errors import ConfigError
from kvscope.sql import with_includes

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):([^}]+)\}")
_NAME = re.compile(r"^[a-z0-9_]+$")
"""Default extra capacities of `capacity_what_if` (fractions of each source's capacity)."""
DEFAULTS: dict[str, Any] = {
    "since": dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    "instance": "",
    "model": "",
    "bucket_s": 60,
    "limit": 1000,
    "fractions": list(WHAT_IF_FRACTIONS),
}
"""Values of the common parameters when the caller gives none (`until` defaults to now)."""
FORMATS = ("table", "json", "csv")
POSITIVE = frozenset({"bucket_s", "limit"})
"""Integer parameters that must be at least 1 (a zero bucket would divide by zero)."""
MAX_FRACTION = 1000.0
"""Largest extra capacity `fractions` takes (x the current capacity): beyond it the block
counts leave the 64-bit range the what-if computes in."""


@dataclass(frozen=True)
class Query:
    """One analytics query: its name, description, SQL (fragments included) and parameters."""

    name: str
    description: str
    sql: str
    params: dict[str, str]
    """Parameter name -> ClickHouse type, as written in the SQL."""

    @property
    def derived(self) -> bool:
        """Whether it reads the materialized residency tables (refreshed before it runs)."""
        return any(re.search(rf"\b{t.name}\b", self.sql) for t in tables.RESIDENCY)


def _folder() -> Any:
    return importlib.resources.files("kvscope.sql").joinpath("queries")


def _read(name: str) -> str:
    entry = _folder().joinpath(f"{name}.sql")
    if not _NAME.match(name.lstrip("_")) or not entry.is_file():
        raise ConfigError(f"unknown query {name!r}; `kvscope query --list` shows them")
    return entry.read_text(encoding="utf-8")


def load_query(name: str) -> Query:
    """The query `name` (file `sql/queries/NAME.sql`) with its fragments included."""
    if name.startswith("_"):
        raise ConfigError(f"{name!r} is a fragment, not a query")
    text = _read(name)
    sql = with_includes(text, fragment)
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    description = first.lstrip("-").strip()
    params = {p: t.strip() for p, t in _PARAM.findall(sql)}
    return Query(name, description, sql, params)


def fragment(name: str) -> str:
    """The fragment `sql/queries/_NAME.sql` as a query includes it: comment lines dropped,
    its own `-- include:` lines expanded (a fragment may include another)."""
    return _strip_comments(with_includes(_read(f"_{name}"), fragment))


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def list_queries() -> list[Query]:
    """Every query shipped in `sql/queries/` (fragments excluded), by name."""
    names = sorted(
        e.name[:-4] for e in _folder().iterdir() if e.name.endswith(".sql") and e.name[0] != "_"
    )
    return [load_query(n) for n in names]


def bind_params(query: Query, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The parameters to send: the caller's, then the defaults; unknown or missing ones fail,
    and so does a window whose since is not before its until."""
    given = dict(params or {})
    unknown = set(given) - set(query.params)
    if unknown:
        raise ConfigError(
            f"query {query.name} has no parameter {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(sorted(query.params)) or 'none'}"
        )
    out: dict[str, Any] = {}
    for name, ch_type in query.params.items():
        if name in given:
            out[name] = _coerce(name, ch_type, given[name])
        elif name == "until":
            out[name] = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        elif name in DEFAULTS:
            out[name] = _coerce(name, ch_type, DEFAULTS[name])
        else:
            raise ConfigError(f"query {query.name} needs --param {name}=... ({ch_type})")
    if "since" in out and "until" in out and out["since"] >= out["until"]:
        raise ConfigError(
            f"since ({out['since'].isoformat()}) must be before until ("
            f"{out['until'].isoformat()}{'' if 'until' in given else ', now'}): "
            "give an earlier since or a later until"
        )
    return out


def _coerce(name: str, ch_type: str, value: Any) -> Any:
    """Turn a CLI string (or a Python value) into the value of a ClickHouse parameter type."""
    try:
        if ch_type.startswith("DateTime"):
            if isinstance(value, dt.datetime):
                stamp = value
            elif isinstance(value, int | float):
                stamp = dt.datetime.fromtimestamp(float(value), dt.UTC)
            else:
                stamp = _time(str(value))
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(dt.UTC).replace(tzinfo=None)
            return stamp
        if ch_type.startswith("Array(Float"):
            return _fractions(value)
        if ch_type.startswith(("UInt", "Int")):
            return _whole(name, ch_type, value)
        if ch_type.startswith("Float"):
            return milliseconds(value)  # every float parameter is an SLO in ms
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"parameter {name}: {value!r} is not a {ch_type}: {exc}") from None
    return str(value)


def _whole(name: str, ch_type: str, value: Any) -> int:
    """`value` as an int inside `ch_type`'s range (and at least 1 for `POSITIVE` names), else
    ValueError saying what to give: a value outside it would wrap around in ClickHouse."""
    bits = int(ch_type.removeprefix("U").removeprefix("Int"))
    lowest = 1 if name in POSITIVE else 0 if ch_type.startswith("U") else -(2 ** (bits - 1))
    highest = 2**bits - 1 if ch_type.startswith("U") else 2 ** (bits - 1) - 1
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or not lowest <= number <= highest:
        raise ValueError(f"give a whole number from {lowest} to {highest}")
    return number


def _fractions(value: Any) -> list[float]:
    """A list, or comma-separated numbers (in brackets or not: `0.25,0.5` or `[0.25, 0.5]`),
    each from 0 to `MAX_FRACTION` (ValueError saying what to give otherwise); a repeated one
    is kept once (the query groups by fraction: twice would sum two copies into one row)."""
    items = value if isinstance(value, list | tuple) else str(value).strip().strip("[]").split(",")
    what = f"give numbers from 0 to {MAX_FRACTION:g}, separated by commas (e.g. 0.25,0.5,1)"
    try:
        numbers = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ValueError(what) from None
    if not all(0 <= n <= MAX_FRACTION for n in numbers):
        raise ValueError(what)
    return list(dict.fromkeys(numbers))


def _time(text: str) -> dt.datetime:
    """`parse_time(text)`, its error as a ValueError (which `_coerce` reports with the
    parameter's name and type)."""
    try:
        return parse_time(text)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class Rows(list):
    """The row dicts of a query and its column names, which an empty answer has too (so a
    CSV of no rows still has its header)."""

    def __init__(self, rows: list[dict], columns: Sequence[str]) -> None:
        super().__init__(rows)
        self.columns = list(rows[0]) if rows else list(columns)


def run_query(
    client: Client, name: str, params: Mapping[str, Any] | None = None, refresh: bool = True
) -> Rows:
    """Run query `name` on a clickhouse-connect client; rows as dicts (column -> value).

    A client with `run_named(name, bound)` (a live serve's `ServeClient`) runs it itself:
    the parameters are bound here either way, so both give the same rows. A query over the
    materialized residency first derives the block events stored since the last refresh
    (`storage.residency.refresh`; nothing to do when the collector keeps it current), so its
    answer always equals the raw events' definition; `refresh=False` reads it as it is.
    """
    query = load_query(name)
    bound = bind_params(query, params)
    if hasattr(client, "run_named"):
        return client.run_named(name, bound)
    if refresh and query.derived:
        residency.refresh(client)
    columns, _, rows = execute(client, query, bound)
    return Rows(refine_rows(client, name, rows, bound), columns)


def execute(
    client: Client, query: Query, bound: Mapping[str, Any]
) -> tuple[list[str], list[str], list[dict]]:
    """Run `query` once: its column names, their ClickHouse types and the rows as dicts.

    An answer without rows has no columns in chDB; they then come from `DESCRIBE`, which
    runs nothing, so an empty answer names its columns too.
    """
    result = client.query(query.sql, parameters=bound)
    if not result.result_rows:
        described = client.query(f"DESCRIBE ({query.sql})", parameters=bound).result_rows
        return [row[0] for row in described], [row[1] for row in described], []
    columns = list(result.column_names)
    rows = [dict(zip(columns, row, strict=True)) for row in result.result_rows]
    return columns, [t.name for t in result.column_types], rows


def refine_rows(
    client: Client, name: str, rows: list[dict], bound: Mapping[str, Any]
) -> list[dict]:
    """Rows of query `name` after the Python stage some queries have (the what-if's replay).

    Every reader (the CLI, the report, a serve's HTTP API) goes through here, so all of
    them give the same rows.
    """
    if name != "capacity_what_if":
        return rows
    from kvscope.analytics.whatif import refine

    return refine(lambda name, params: run_query(client, name, params), rows, bound)


def _plain(value: Any) -> Any:
    """A JSON/CSV-friendly version of one value (ISO times, None for nan)."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_UNSAFE = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
    for c in [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
}
"""Control characters (C0, DEL, C1: ESC, CR, ...) and bidi overrides, as visible escapes."""


def terminal_safe(text: str) -> str:
    """`text` safe to print on a terminal: control and bidi characters shown escaped.

    Names come from engines (an instance name can hold ANSI escapes or a CR that would
    rewrite what the terminal shows); JSON output escapes them by itself.
    """
    return text.translate(_UNSAFE)


def format_rows(rows: Sequence[Mapping[str, Any]], fmt: str) -> str:
    """Render rows as `table` (aligned text), `json` (array of objects) or `csv`.

    Table and CSV cells go through `terminal_safe`; a CSV of no `Rows` has their header."""
    if fmt == "json":
        return json.dumps([{k: _plain(v) for k, v in r.items()} for r in rows], indent=1)
    columns = list(rows[0]) if rows else list(getattr(rows, "columns", []))
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([terminal_safe(c) for c in columns])
        writer.writerows([[_csv_cell(r[c]) for c in columns] for r in rows])
        return out.getvalue()
    if fmt != "table":
        raise ConfigError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not rows:
        return "(no rows)"
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else terminal_safe(str(value))


def _csv_cell(value: Any) -> Any:
    value = _plain(value)
    return terminal_safe(value) if isinstance(value, str) else value

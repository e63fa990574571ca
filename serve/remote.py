"""`ServeClient`: run named queries through a live `kvscope serve` instead of opening chDB.

`kvscope query` and `kvscope report` use it when a serve holds the data directory. It
answers `run_named(name, params)` (which `queries.run_query` prefers when a client has it)
with rows typed as a direct clickhouse-connect query returns them: the API sends each
column's ClickHouse type, and `decode_value` turns the JSON back (ISO strings into
datetimes, null into nan for non-Nullable floats), so the output is the same either way.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvscope.analytics.queries import Rows
from kvscope.collector.errors import SinkError
from kvscope.schemas.errors import ConfigError

if TYPE_CHECKING:
    from kvscope.index.stored import Snapshot

log = logging.getLogger(__name__)

_WRAPPER = re.compile(r"^(Nullable|LowCardinality)\((.*)\)$")
_ARRAY = re.compile(r"^Array\((.*)\)$")


def wire_value(value: Any) -> str:
    """A bound parameter as the text `bind_params` reads back to the same value."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return ",".join(repr(float(v)) for v in value)
    return str(value)


def decode_value(ch_type: str, value: Any) -> Any:
    """The Python value clickhouse-connect gives for `ch_type`, from its JSON form."""
    match = _WRAPPER.match(ch_type)
    if match:
        inner = match.group(2)
        if match.group(1) == "Nullable" and value is None:
            return None
        return decode_value(inner, value)
    match = _ARRAY.match(ch_type)
    if match and isinstance(value, list):
        return [decode_value(match.group(1), v) for v in value]
    if value is None and ch_type.startswith(("Float", "BFloat")):
        return math.nan
    if isinstance(value, str):
        if ch_type.startswith("DateTime"):
            return dt.datetime.fromisoformat(value)
        if ch_type.startswith("Date"):
            return dt.date.fromisoformat(value)
    return value


class ServeClient:
    """Reads through a serve's HTTP API: the named queries only, never SQL."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        """GET `path` with query parameters; one-line errors for every failure."""
        query = urllib.parse.urlencode(dict(params or {}))
        request = urllib.request.Request(f"{self.url}{path}" + (f"?{query}" if query else ""))
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as reply:
                return reply.read()
        except urllib.error.HTTPError as exc:
            message = _error_text(exc)
            if exc.code == 400 or exc.code == 404:
                raise ConfigError(message) from None
            if exc.code == 401:
                raise ConfigError(
                    f"kvscope serve at {self.url} refused the token: set KVSCOPE_SERVE_TOKEN "
                    "to the serve's --token"
                ) from None
            raise SinkError(f"kvscope serve at {self.url} failed: {message}") from None
        except OSError as exc:
            raise SinkError(
                f"cannot reach kvscope serve at {self.url} ({exc}); is it still running?"
            ) from None

    def get_json(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET `path` and parse the JSON answer."""
        return json.loads(self.get(path, params))

    def run_named(self, name: str, params: Mapping[str, Any]) -> Rows:
        """Rows of named query `name` with bound `params`, typed as a direct query gives them."""
        wire = {key: wire_value(value) for key, value in params.items()}
        answer = self.get_json(f"/api/query/{urllib.parse.quote(name)}", wire)
        types = dict(zip(answer["columns"], answer["types"], strict=True))
        rows = [
            {column: decode_value(types[column], value) for column, value in row.items()}
            for row in answer["rows"]
        ]
        return Rows(rows, answer["columns"])

    def close(self) -> None:
        """Nothing to release (one request per call); here so callers can treat it as a client."""


class ServeSnapshotReader:
    """The index's cold-start snapshot, read through a live serve that owns the chDB
    directory (`GET /api/index/snapshot`)."""

    def __init__(self, client: ServeClient) -> None:
        self.client = client

    def read(self, topic: str) -> Snapshot:
        """See `kvscope.index.stored.SnapshotReader`."""
        from kvscope.index.stored import snapshot_from_ipc

        return snapshot_from_ipc(self.client.get("/api/index/snapshot", {"topic": topic}))


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"

"""The capacity what-if's best estimate: replay the access stream when there is one.

`capacity_what_if.sql` predicts from refault distances (events only) and labels its rows
`refault-corrected`. When the window has an access stream (`kv_accesses`), `refine`
replaces each source's `predicted_hit_rate` with the pool replay's (`access_replay`):
the hit rate the data shows plus the hits the replay gains at the larger size over the
replay at the observed size, so a replay that misses a little of the observed hits (a
window cut mid-request) shifts both sides alike. The method and its error range in
points (measured against simulator re-runs, or against real vLLM runs where the
accesses come from real engines: `cachemodel.whatif.error_range`, docs/analytics.md) go into
`method` and `error_pp`, and where that range was measured into `error_basis` (`simulator`
or `real-engines`); the refault model's numbers stay in their own columns for comparison.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kvscope.cachemodel.access_replay import Access, settle_clears
from kvscope.cachemodel.whatif import ERROR_PP, error_basis, error_range, replay_gains

log = logging.getLogger(__name__)

_ACCESS_PARAMS = ("since", "until", "instance", "model")


Fetch = Callable[[str, Mapping[str, Any]], list[dict]]
"""fetch(query name, parameters) -> rows: how `refine` runs the `accesses` query."""


def load_accesses(fetch: Fetch, params: Mapping[str, Any]) -> tuple[list[Access], list]:
    """The access rows and the clears (source, µs) of the window, from `kv_accesses`; the
    clears moved back to when the engine performed them (`settle_clears`)."""
    rows = fetch("accesses", {k: params[k] for k in _ACCESS_PARAMS if k in params})
    accesses: list[Access] = []
    clears: list[tuple[str, int]] = []
    for r in rows:
        source = f"{r['instance']}/{r['dp_rank']}"
        if r["kind"] == "clear":
            clears.append((source, _us(r["ts"])))
            continue
        accesses.append(
            Access(
                source=source,
                role=r["role"],
                arrival_us=_us(r["arrival_ts"]),
                lookup_us=_us(r["lookup_ts"]),
                free_us=_us(r["free_ts"]),
                prompt_tokens=r["prompt_tokens"],
                block_size=r["block_size"],
                hit_blocks=r["hit_blocks"],
                held_blocks=r["held_blocks"],
                hashes=list(r["block_hashes"]),
                held_until_free=bool(r["held_until_free"]),
                engine=r["engine"],
            )
        )
    return accesses, settle_clears(accesses, clears)


def _us(ts: Any) -> int:
    """A naive-UTC or aware datetime as whole µs since the epoch."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return round(ts.timestamp() * 1e6)


def refine(fetch: Fetch, rows: list[dict], params: Mapping[str, Any]) -> list[dict]:
    """`capacity_what_if` rows with the replay's prediction wherever accesses exist."""
    for r in rows:
        r["error_pp"] = ERROR_PP[r["method"]]
        r["error_basis"] = "simulator"
    accesses, clears = load_accesses(fetch, params)
    if not accesses:
        return rows
    sources = [r for r in rows if r["instance"] != "*"]
    capacity = {_key(r): int(r["capacity_blocks"]) for r in sources}
    seen = {a.source for a in accesses}
    capacity = {k: v for k, v in capacity.items() if k in seen}
    if not capacity:
        return rows
    extras = {
        f: {k: _extra(sources, k, f) for k in capacity} for f in {r["fraction"] for r in sources}
    }
    method, gains = replay_gains(accesses, clears, capacity, extras)
    engines = {a.engine for a in accesses}
    error = (error_range(method, engines), error_basis(method, engines))
    log.info("capacity what-if: replayed %d accesses (%s)", len(accesses), method)
    fleet_saved: dict[float, float] = {}
    all_replayed: dict[float, bool] = {}
    for r in sources:
        gain = gains.get((_key(r), r["fraction"]))
        replayed = gain is not None and bool(r["queries"])
        all_replayed[r["fraction"]] = all_replayed.get(r["fraction"], True) and replayed
        if replayed:
            saved = gain * r["queries"]
            _set(r, r["hit_rate"] + gain, saved, method, error)
        fleet_saved[r["fraction"]] = fleet_saved.get(r["fraction"], 0.0) + float(
            r["saved_tokens_replay"] if replayed else r["saved_tokens_corrected"]
        )
    for r in rows:
        f = r["fraction"]
        if r["instance"] == "*" and all_replayed.get(f) and r["queries"]:
            _set(r, (r["hits"] + fleet_saved[f]) / r["queries"], fleet_saved[f], method, error)
    return rows


def _extra(sources: list[dict], key: str, fraction: float) -> int:
    """`extra_blocks` of source `key` at `fraction` (as the SQL computed it)."""
    for r in sources:
        if _key(r) == key and r["fraction"] == fraction:
            return int(r["extra_blocks"])
    return 0


def _key(row: Mapping[str, Any]) -> str:
    return f"{row['instance']}/{row['dp_rank']}"


def _set(row: dict, predicted: float, saved: float, method: str, error: tuple[float, str]) -> None:
    row["predicted_hit_rate"] = min(1.0, predicted)
    row["saved_tokens_replay"] = row["predicted_saved_tokens"] = round(saved)
    row["method"] = method
    row["error_pp"], row["error_basis"] = error

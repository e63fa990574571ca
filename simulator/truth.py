"""Ground truth of a simulated run: the analytics' definitions computed in plain Python.

The recorder watches every KV event in the simulator's global time order and computes
what the SQL analytics must find in ClickHouse (docs/analytics.md has the definitions):
residency intervals, removals, clears, refaults with their distances, routing
opportunity and duplication, token-weighted hit rates, transfer latency quantiles,
and the capacity what-if predicted from the refault distances.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.cachemodel.blockpool import PoolEvent
from kvscope.cachemodel.whatif import WHAT_IF_FRACTIONS


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile of sorted `values` (numpy's default method); None if empty."""
    if not values:
        return None
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def extra_blocks(capacity: int, fraction: float) -> int:
    """Δ of the what-if for one source: floor(capacity x fraction) (the SQL uses the same)."""
    return math.floor(capacity * fraction)


@dataclass
class _SourceTruth:
    model: str
    role: str
    capacity_blocks: int
    resident: dict[int, int] = field(default_factory=dict)
    """hash -> store time (µs) of every block now cached."""
    last_removal: dict[int, tuple[int, int]] = field(default_factory=dict)
    """hash -> (index among removals, stream position) of its latest removal since a clear."""
    position: int = 0
    """Rows of this source's stream so far (one per stored/removed hash, one per clear)."""
    stores: int = 0
    removals: int = 0
    clears: int = 0
    ended_by_clear: int = 0
    closed_us: list[int] = field(default_factory=list)
    refaults: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(distance, tokens, removal position, store position) of every refault."""
    opportunity_blocks: int = 0
    opportunity_tokens: int = 0
    stored_tokens: int = 0
    queries: int = 0
    hits: int = 0
    minutes: set[int] = field(default_factory=set)
    """Minutes (µs // 60e6) in which this source had a KV-event row (the 1m aggregate's rows)."""


class TruthRecorder:
    """Collects the ground truth of one simulated run; `summary()` is the truth file."""

    def __init__(self) -> None:
        self._sources: dict[str, _SourceTruth] = {}
        self._holders: dict[tuple[str, str, int], int] = defaultdict(int)
        self._transfers: dict[str, list[float]] = defaultdict(list)
        self._transfer_bytes: dict[str, int] = defaultdict(int)
        self._request_rates: list[float] = []
        self.requests = 0

    def add_source(self, key: str, model: str, role: str, capacity_blocks: int) -> None:
        """Register a source (`instance/dp_rank`) before its first event."""
        self._sources[key] = _SourceTruth(model, role, capacity_blocks)

    def on_events(self, key: str, ts_us: int, events: Iterable[PoolEvent], block_size: int) -> None:
        """Apply one KV-event batch of source `key` at time `ts_us`, in order."""
        src = self._sources[key]
        for ev in events:
            if ev.kind == "cleared" or ev.hashes:
                src.minutes.add(ts_us // 60_000_000)
            if ev.kind == "stored":
                for h in ev.hashes:
                    self._store(src, h, ts_us, block_size)
            elif ev.kind == "removed":
                for h in ev.hashes:
                    src.position += 1
                    src.closed_us.append(ts_us - src.resident.pop(h))
                    src.last_removal[h] = (src.removals, src.position)
                    src.removals += 1
                    self._holders[(src.model, src.role, h)] -= 1
            else:
                src.position += 1
                src.clears += 1
                for h, start in src.resident.items():
                    src.closed_us.append(ts_us - start)
                    self._holders[(src.model, src.role, h)] -= 1
                src.ended_by_clear += len(src.resident)
                src.resident.clear()
                src.last_removal.clear()

    def _store(self, src: _SourceTruth, h: int, ts_us: int, block_size: int) -> None:
        src.position += 1
        src.stores += 1
        src.stored_tokens += block_size
        removed = src.last_removal.pop(h, None)
        if removed is not None:
            index, position = removed
            src.refaults.append((src.removals - index - 1, block_size, position, src.position))
        key = (src.model, src.role, h)
        if self._holders[key] > 0:
            src.opportunity_blocks += 1
            src.opportunity_tokens += block_size
        self._holders[key] += 1
        src.resident[h] = ts_us

    def on_prefix(self, key: str, queries: int, hits: int) -> None:
        """One prefix-cache lookup of `queries` prompt tokens of which `hits` were cached."""
        src = self._sources[key]
        src.queries += queries
        src.hits += hits

    def on_request(self, prompt_tokens: int, cached_tokens: int) -> None:
        """One finished request (per serving source) for the per-request hit rate."""
        self.requests += 1
        self._request_rates.append(cached_tokens / prompt_tokens if prompt_tokens else 0.0)

    def on_transfer(self, src: str, dst: str, latency_s: float, nbytes: int) -> None:
        """One KV transfer between a prefill and a decode instance."""
        self._transfers[f"{src}->{dst}"].append(latency_s * 1000.0)
        self._transfer_bytes[f"{src}->{dst}"] += nbytes

    def samples(self) -> dict[str, dict[str, list[float]]]:
        """The sorted raw samples behind the summary's quantiles, for tests and checks.

        `residency_s` and `refault_distance` per source, `transfer_ms` per pair.
        """
        return {
            "residency_s": {
                k: sorted(d / 1e6 for d in s.closed_us) for k, s in self._sources.items()
            },
            "refault_distance": {
                k: sorted(float(r[0]) for r in s.refaults) for k, s in self._sources.items()
            },
            "transfer_ms": {pair: sorted(ms) for pair, ms in self._transfers.items()},
        }

    def summary(self, config: dict[str, Any]) -> dict[str, Any]:
        """The truth file's content (JSON-ready); see docs/simulator.md."""
        sources = {key: self._source_summary(s) for key, s in sorted(self._sources.items())}
        queries = sum(s.queries for s in self._sources.values())
        hits = sum(s.hits for s in self._sources.values())
        stores = sum(s.stores for s in self._sources.values())
        opportunity = sum(s.opportunity_blocks for s in self._sources.values())
        held = [n for n in self._holders.values() if n > 0]
        rates = sorted(self._request_rates)
        fleet = {
            "hit_rate": hits / queries if queries else 0.0,
            "prefix_queries": queries,
            "prefix_hits": hits,
            "requests_finished": self.requests,
            "request_hit_rate_p50": quantile(rates, 0.5),
            "stored_blocks": stores,
            "routing_opportunity_blocks": opportunity,
            "routing_opportunity_share": opportunity / stores if stores else 0.0,
            "routing_opportunity_tokens": sum(s.opportunity_tokens for s in self._sources.values()),
            "duplication_share": sum(1 for n in held if n >= 2) / len(held) if held else 0.0,
            "resident_hashes": len(held),
            "what_if": self._fleet_what_if(queries, hits),
        }
        return {"config": config, "fleet": fleet, "sources": sources, "transfers": self._pairs()}

    def _source_summary(self, s: _SourceTruth) -> dict[str, Any]:
        closed = sorted(d / 1e6 for d in s.closed_us)
        dist = sorted(r[0] for r in s.refaults)
        active_s = (max(s.minutes) - min(s.minutes) + 1) * 60 if s.minutes else 0
        return {
            "model": s.model,
            "role": s.role,
            "capacity_blocks": s.capacity_blocks,
            "stored_blocks": s.stores,
            "removed_blocks": s.removals,
            "cleared": s.clears,
            "refaults": len(s.refaults),
            "hit_rate": s.hits / s.queries if s.queries else 0.0,
            "prefix_queries": s.queries,
            "prefix_hits": s.hits,
            "churn_ratio": s.removals / s.stores if s.stores else 0.0,
            "removals_per_s": s.removals / active_s if active_s else 0.0,
            "active_minutes": sorted(m * 60 for m in s.minutes),
            "routing_opportunity_blocks": s.opportunity_blocks,
            "routing_opportunity_tokens": s.opportunity_tokens,
            "stored_tokens": s.stored_tokens,
            "residency": {
                "intervals": s.stores,
                "closed": len(closed),
                "ended_by_removal": s.removals,
                "ended_by_clear": s.ended_by_clear,
                "open": len(s.resident),
                "p50_s": quantile(closed, 0.5),
                "p90_s": quantile(closed, 0.9),
                "p99_s": quantile(closed, 0.99),
                "max_s": closed[-1] if closed else None,
            },
            "refault_distances": {
                "count": len(dist),
                "p50": quantile(dist, 0.5),
                "p90": quantile(dist, 0.9),
                "p99": quantile(dist, 0.99),
                "max": dist[-1] if dist else None,
                "tokens": sum(r[1] for r in s.refaults),
            },
            "what_if": [self._what_if_at(s, f) for f in WHAT_IF_FRACTIONS],
        }

    def what_if(self, fractions: Sequence[float]) -> dict[str, list[dict[str, Any]]]:
        """Every source's what-if point for each of `fractions`, in their order (the
        summary has them for `WHAT_IF_FRACTIONS`; tests ask for other extra capacities)."""
        return {
            key: [self._what_if_at(s, f) for f in fractions]
            for key, s in sorted(self._sources.items())
        }

    def _what_if_at(self, s: _SourceTruth, fraction: float) -> dict[str, Any]:
        return self._what_if_point(s, fraction, extra_blocks(s.capacity_blocks, fraction))

    @staticmethod
    def _what_if_point(s: _SourceTruth, fraction: float, delta: int) -> dict[str, Any]:
        """First order: refaults with distance < Δ are saved. Corrected: each distance
        minus the first-order-saved re-stores inside its window (avoided evictions)."""
        first = [d < delta for d, _, _, _ in s.refaults]
        stores = sorted(r[3] for r, ok in zip(s.refaults, first, strict=True) if ok)
        saved = sum(r[1] for r, ok in zip(s.refaults, first, strict=True) if ok)
        corrected = 0
        for d, tokens, removed_at, stored_at in s.refaults:
            avoided = bisect_left(stores, stored_at) - bisect_right(stores, removed_at)
            if d - avoided < delta:
                corrected += tokens
        rate = (s.hits + saved) / s.queries if s.queries else 0.0
        rate_c = (s.hits + corrected) / s.queries if s.queries else 0.0
        return {
            "fraction": fraction,
            "extra_blocks": delta,
            "saved_tokens": saved,
            "predicted_hit_rate": rate,
            "saved_tokens_corrected": corrected,
            "predicted_hit_rate_corrected": rate_c,
        }

    def _fleet_what_if(self, queries: int, hits: int) -> list[dict[str, Any]]:
        out = []
        for f in WHAT_IF_FRACTIONS:
            points = [self._what_if_at(s, f) for s in self._sources.values()]
            saved = sum(p["saved_tokens"] for p in points)
            corrected = sum(p["saved_tokens_corrected"] for p in points)
            out.append(
                {
                    "fraction": f,
                    "saved_tokens": saved,
                    "predicted_hit_rate": (hits + saved) / queries if queries else 0.0,
                    "saved_tokens_corrected": corrected,
                    "predicted_hit_rate_corrected": (hits + corrected) / queries
                    if queries
                    else 0.0,
                }
            )
        return out

    def _pairs(self) -> dict[str, Any]:
        out = {}
        for pair, lat in sorted(self._transfers.items()):
            ms = sorted(lat)
            out[pair] = {
                "count": len(ms),
                "bytes": self._transfer_bytes[pair],
                "p50_ms": quantile(ms, 0.5),
                "p90_ms": quantile(ms, 0.9),
                "p99_ms": quantile(ms, 0.99),
                "max_ms": ms[-1],
            }
        return out

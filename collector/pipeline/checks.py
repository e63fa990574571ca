"""The check that sends a record beyond the wire limits to `ingest_errors`, and the column
layout of the one-row-per-record streams.

The limits themselves are part of the wire contract (`kvscope.schemas.limits`). The tables
bound more than the wire format, and some values cost the collector or its readers far more
than their bytes; every limit is documented in docs/collector.md, and a record over one is
stored in `ingest_errors` with a reason naming the field and the limit, never partially
stored. `FLAT_COLUMNS` lives here: column building reads it, and the checks derive each
field's bound from its column kind.
"""

from __future__ import annotations

import math
from typing import Any

from kvscope.collector.pipeline import hashes
from kvscope.schemas import Gap
from kvscope.schemas.limits import (
    MAX_DP_RANK,
    MAX_LIST_ITEMS,
    MAX_NAME_CHARS,
    MAX_ROWS_PER_RECORD,
    MAX_SEQ,
    MAX_TEXT_CHARS,
    MAX_UINT32,
    TS_MAX,
    TS_MIN,
)

FLAT_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "engine-stats": [
        ("capacity_blocks", "capacity_blocks", "uint64"),
        ("block_size", "block_size", "uint32"),
        ("usage", "usage", "float64"),
        ("running", "running", "uint32"),
        ("waiting", "waiting", "uint32"),
        ("prefix_queries", "prefix_queries_delta", "uint64"),
        ("prefix_hits", "prefix_hits_delta", "uint64"),
        ("preemptions", "preemptions_delta", "uint64"),
        ("interval_s", "interval_s", "float64"),
    ],
    "requests": [
        ("request_id", "request_id", "string"),
        ("prompt_tokens", "prompt_tokens", "uint32"),
        ("cached_tokens", "cached_tokens", "uint32"),
        ("output_tokens", "output_tokens", "uint32"),
        ("ttft_s", "ttft_s", "float64"),
        ("queue_s", "queue_s", "float64"),
        ("prefill_s", "prefill_s", "float64"),
        ("decode_s", "decode_s", "float64"),
        ("e2e_s", "e2e_s", "float64"),
        ("finish_reason", "finish_reason", "dict"),
    ],
    "kv-transfers": [
        ("request_id", "request_id", "string"),
        ("src_instance", "src_instance", "dict"),
        ("dst_instance", "dst_instance", "dict"),
        ("backend", "backend", "dict"),
        ("bytes", "bytes", "uint64"),
        ("blocks", "blocks", "uint32"),
        ("chunks", "chunks", "uint32"),
        ("start_ts", "start_ts", "ts"),
        ("end_ts", "end_ts", "ts"),
        ("latency_s", "latency_s", "float64"),
        ("status", "status", "dict"),
    ],
    "engine-histograms": [
        ("metric", "metric", "dict"),
        ("kind", "kind", "dict"),
        ("labels", "labels", "map"),
        ("bounds", "bounds", "list_float64"),
        ("bucket_deltas", "bucket_deltas", "list_uint64"),
        ("sum_delta", "sum_delta", "float64"),
        ("count_delta", "count_delta", "uint64"),
        ("value", "value", "float64"),
        ("interval_s", "interval_s", "float64"),
    ],
    "kv-accesses": [
        ("request_id", "request_id", "string"),
        ("prompt_tokens", "prompt_tokens", "uint32"),
        ("block_size", "block_size", "uint32"),
        ("hit_blocks", "hit_blocks", "uint32"),
        ("held_blocks", "held_blocks", "uint32"),
        ("block_hashes", "block_hashes", "hashes"),
        ("arrival_ts", "arrival_ts", "ts"),
        ("lookup_ts", "lookup_ts", "ts"),
        ("free_ts", "free_ts", "ts"),
        ("held_until_free", "held_until_free", "uint8"),
        ("session", "session", "string"),
    ],
}
"""Column, body attribute and kind of the one-row-per-record streams (`hashes`: a request's
block hashes, bounded like a KV batch's rows rather than like a short list)."""


def _ts(value: float, field: str) -> str | None:
    if not (math.isfinite(value) and TS_MIN <= value < TS_MAX):
        return f"{field} {value!r} is outside [{TS_MIN:.0f}, {TS_MAX:.0f}) (1970..2100, finite)"
    return None


def _chars(value: str, field: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"{field} has {len(value)} characters (limit {limit})"
    return None


def _source(envelope: Any) -> str | None:
    """The limits every envelope shares: source names, dp_rank, seq, ts.

    Checked per record, so first in one expression (NaN fails the ts comparison too);
    only a record over a limit pays for finding which one.
    """
    source = envelope.source
    if (
        len(source.instance) <= MAX_NAME_CHARS
        and len(source.model) <= MAX_NAME_CHARS
        and len(source.engine) <= MAX_NAME_CHARS
        and len(source.engine_version) <= MAX_NAME_CHARS
        and source.dp_rank <= MAX_DP_RANK
        and envelope.seq <= MAX_SEQ
        and TS_MIN <= envelope.ts < TS_MAX
    ):
        return None
    for field in ("instance", "model", "engine", "engine_version"):
        problem = _chars(getattr(source, field), f"source.{field}", MAX_NAME_CHARS)
        if problem:
            return problem
    if source.dp_rank > MAX_DP_RANK:
        return f"source.dp_rank {source.dp_rank} exceeds {MAX_DP_RANK}"
    if envelope.seq > MAX_SEQ:
        return f"seq {envelope.seq} exceeds {MAX_SEQ}"
    return _ts(envelope.ts, "ts")


def _gap(body: Gap) -> str | None:
    if body.first_seq > body.last_seq:
        return f"Gap first_seq {body.first_seq} > last_seq {body.last_seq}"
    if body.last_seq > MAX_SEQ:
        return f"Gap last_seq {body.last_seq} exceeds {MAX_SEQ}"
    return _chars(body.reason, "Gap reason", MAX_TEXT_CHARS)


def _field(value: Any, field: str, kind: str) -> str | None:
    """The bound of one flat-stream field, from its column kind."""
    if kind == "ts":
        return _ts(value, field)
    if kind == "dict":
        return _chars(value, field, MAX_NAME_CHARS)
    if kind == "string":
        return _chars(value, field, MAX_TEXT_CHARS)
    if kind == "uint32" and value > MAX_UINT32:
        return f"{field} {value} exceeds {MAX_UINT32}"
    if kind == "hashes" and len(value) > MAX_ROWS_PER_RECORD:
        return f"{field} has {len(value)} hashes (limit {MAX_ROWS_PER_RECORD})"
    if kind.startswith("list_") and len(value) > MAX_LIST_ITEMS:
        return f"{field} has {len(value)} items (limit {MAX_LIST_ITEMS})"
    if kind == "map":
        if len(value) > MAX_LIST_ITEMS:
            return f"{field} has {len(value)} entries (limit {MAX_LIST_ITEMS})"
        for key, item in value.items():
            problem = _chars(key, f"{field} name", MAX_NAME_CHARS) or _chars(
                item, f"{field} value", MAX_TEXT_CHARS
            )
            if problem:
                return problem
    return None


def kv_rows(body: Any) -> int:
    """Rows a (flat) KV batch becomes: one per block hash, one per AllBlocksCleared."""
    return sum(hashes.count(e.block_hashes) or (e.type == "AllBlocksCleared") for e in body.events)


def violation(stream: str, envelope: Any, size: int) -> str | None:
    """Why `envelope` (decoded from `size` bytes) exceeds a limit, or None when it fits.

    KV batches are the hot path: their per-event limits are msgspec constraints checked
    while decoding (see `kvscope.collector.pipeline.decode.FlatEvent`); rows are counted
    only when the record has more bytes than `MAX_ROWS_PER_RECORD`, since every row
    takes at least one byte.
    """
    problem = _source(envelope)
    if problem:
        return problem
    body = envelope.body
    if type(body) is Gap:
        return _gap(body)
    if stream == "kv-events":
        if size > MAX_ROWS_PER_RECORD and (rows := kv_rows(body)) > MAX_ROWS_PER_RECORD:
            return f"KV batch of {rows} rows (limit {MAX_ROWS_PER_RECORD} per record)"
        return None
    for _, attr, kind in FLAT_COLUMNS[stream]:
        problem = _field(getattr(body, attr), attr, kind)
        if problem:
            return problem
    return None

"""The stored access stream as a Mooncake-format trace (`kvscope trace export`).

Each line is one request: `timestamp` (ms since the first arrival), `input_length`,
`output_length` and `hash_ids`, one id per full block of the prompt, the format of the
traces published with the Mooncake FAST'25 paper, which `kvscope simulate --workload
trace` and other tools read. The engine's block hashes never leave: each is replaced by a
dense integer, numbered in order of first appearance, so equal ids at equal positions
still mean equal prefixes (an engine hash already names its whole prefix). A prompt's
partial last block has no hash; readers pad the prompt past its ids with tokens of its
own, as vLLM never caches a partial block either. Ids stand for the engine's block size,
which the trace cannot say in a line: `TraceSummary.block_size` states it (the CLI prints
it with the replay command).

A request of a P/D fleet is looked up on both sides; the decode side's lookups are left
out whenever the window has any other, so each request appears once, as the prefill side
saw it. `output_length` is the request's own RequestFinished count, else (no requests
stream) the tokens its held blocks had room for beyond the prompt, at most a block more;
in a P/D fleet the decode side's (the prefill side produced one token, the decode side
the rest).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from kvscope.schemas.errors import ConfigError


@dataclass(frozen=True)
class TraceSummary:
    """What an export wrote."""

    requests: int
    block_size: int
    """Tokens one hash id stands for (the engine's block size)."""
    distinct_ids: int
    sources: int
    """Sources (instance, dp rank) whose lookups the trace holds."""
    span_s: float
    """Seconds from the first arrival to the last."""


def _seconds(ts: Any) -> float:
    if isinstance(ts, dt.datetime):
        return (ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)).timestamp()
    return float(ts)


def trace_lines(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], TraceSummary]:
    """Rows of the `trace_requests` query as Mooncake trace lines (dicts), and a summary.

    Raises `ConfigError` when the window has no accesses or mixes block sizes.
    """
    rows = list(rows)
    decoded = {
        r["request_id"]: _output(r, int(r["block_size"])) for r in rows if r["role"] == "decode"
    }
    if any(r["role"] != "decode" for r in rows):
        rows = [r for r in rows if r["role"] != "decode"]
    if not rows:
        raise ConfigError(
            "no accesses in this window: widen --since/--until, check --instance/--model, "
            "and check the engines publish the access stream (docs/publisher.md)"
        )
    sizes = sorted({int(r["block_size"]) for r in rows})
    if len(sizes) > 1:
        raise ConfigError(
            f"the window mixes block sizes {', '.join(map(str, sizes))}: one trace has one "
            "block size; narrow it with --instance or --model"
        )
    block_size = sizes[0]
    rows.sort(key=lambda r: (_seconds(r["arrival_ts"]), r["instance"], r["dp_rank"]))
    start = _seconds(rows[0]["arrival_ts"])
    ids: dict[int, int] = {}
    lines = []
    for r in rows:
        prompt = int(r["prompt_tokens"])
        output = decoded.get(r["request_id"], _output(r, block_size))
        lines.append(
            {
                "timestamp": round((_seconds(r["arrival_ts"]) - start) * 1000),
                "input_length": prompt,
                "output_length": int(output),
                "hash_ids": [ids.setdefault(int(h), len(ids)) for h in r["prompt_hashes"]],
            }
        )
    span = _seconds(rows[-1]["arrival_ts"]) - start
    sources = len({(r["instance"], r["dp_rank"]) for r in rows})
    return lines, TraceSummary(len(lines), block_size, len(ids), sources, span)


def _output(row: Mapping[str, Any], block_size: int) -> int:
    """The output tokens of one access row: its RequestFinished count, else what its held
    blocks had room for beyond the prompt."""
    if row["output_tokens"] is not None:
        return int(row["output_tokens"])
    return max(0, int(row["held_blocks"]) * block_size - int(row["prompt_tokens"]))


def write_lines(lines: Iterable[Mapping[str, Any]], out: TextIO) -> None:
    """One compact JSON object per line."""
    for line in lines:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")

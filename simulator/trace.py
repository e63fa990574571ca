"""Production-trace replay: requests from a Mooncake-format trace (JSON lines).

Each line: `timestamp` (ms since the trace start), `input_length` and `output_length`
(tokens) and `hash_ids`, one id per 512-token block of the prompt, prefix-chained (equal
ids at equal positions mean equal prefixes), the format of the traces published with the
Mooncake FAST'25 paper. Traces of the same shape with other units are read too: ids of
other blocks (`block_tokens`: 16 in Alibaba's Qwen "blksz_16" traces) and timestamps in
other units (`timestamp_s`: seconds there). The trace has no tokens, so each id gets
`block_tokens` synthetic tokens drawn from a generator seeded by the id: requests sharing
ids share tokens, so they share the simulator's chained block hashes whatever the engine's
block size. With `block_size` 512 one 512-token trace block is one engine block; with 16,
it is 32 engine blocks (docs/simulator.md). A prompt longer than its ids cover is padded
with tokens of its own; the last id may cover a partial block. `trace_records` writes
requests back in this format (for generated traces).
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import random
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
from kvscope.schemas.errors import ConfigError
from kvscope.simulator.workloads import VOCAB, SimRequest

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip file (a trace may be kept compressed)."""
TRACE_BLOCK = 512
"""Tokens per trace hash id in the Mooncake traces (the default)."""
TRACE_TIMESTAMP_S = 0.001
"""Seconds per trace timestamp unit in the Mooncake traces: milliseconds (the default)."""
MAX_TRACE_BLOCK = 1 << 20
"""The largest trace block accepted (tokens per hash id)."""


class TraceLine(msgspec.Struct):
    """One request of a Mooncake trace (unknown fields are ignored)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] = []


def _block_tokens(
    cache: dict[int, list[int]], seed: int, block_id: int, block_tokens: int
) -> list[int]:
    tokens = cache.get(block_id)
    if tokens is None:
        rng = random.Random(f"trace-block/{seed}/{block_id}")
        tokens = cache[block_id] = [rng.randrange(VOCAB) for _ in range(block_tokens)]
    return tokens


def read_trace(path: str | Path, limit: int, max_tokens: int | None = None) -> list[TraceLine]:
    """The first `limit` lines of a trace file, plain or gzip-compressed; a bad line fails
    with its line number, as does one of more than `max_tokens` (input and output)."""
    decoder = msgspec.json.Decoder(TraceLine)
    lines: list[TraceLine] = []
    try:
        with open(path, "rb") as probe:
            gzipped = probe.read(2) == GZIP_MAGIC
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if len(lines) >= limit:
                    break
                if number == 1:
                    raw = raw.removeprefix(codecs.BOM_UTF8)  # saved by a Windows editor
                if not raw.strip():
                    continue
                try:
                    line = decoder.decode(raw)
                except msgspec.ValidationError as exc:
                    raise ConfigError(
                        f"{path}:{number}: not a Mooncake trace line: {exc}"
                    ) from None
                except msgspec.DecodeError:
                    raise ConfigError(f"{path}:{number}: not JSON") from None
                if line.input_length < 1:
                    raise ConfigError(f"{path}:{number}: input_length must be >= 1")
                if line.output_length < 0:
                    raise ConfigError(f"{path}:{number}: output_length must be >= 0")
                tokens = line.input_length + line.output_length
                if max_tokens is not None and tokens > max_tokens:
                    raise ConfigError(
                        f"{path}:{number}: {tokens:,} tokens (input and output), more than one "
                        f"instance's cache holds ({max_tokens:,}: --capacity-blocks x "
                        "--block-size): raise --capacity-blocks"
                    )
                lines.append(line)
    except (OSError, EOFError, zlib.error) as exc:  # gzip: bad header, cut short, bad data
        raise ConfigError(
            f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if not lines:
        raise ConfigError(f"trace {path} has no requests")
    return lines


def load_trace(
    path: str | Path,
    limit: int,
    seed: int,
    time_scale: float = 1.0,
    max_tokens: int | None = None,
    *,
    block_tokens: int = TRACE_BLOCK,
    timestamp_s: float = TRACE_TIMESTAMP_S,
) -> list[SimRequest]:
    """Simulator requests for the first `limit` trace lines, arrivals times `time_scale`;
    a line of more than `max_tokens` is refused before its tokens are drawn. Each hash id
    stands for `block_tokens` tokens, and a timestamp unit for `timestamp_s` seconds."""
    if time_scale <= 0:
        raise ConfigError("--time-scale must be > 0")
    check_trace_units(block_tokens, timestamp_s)
    lines = read_trace(path, limit, max_tokens)
    start = min(line.timestamp for line in lines)
    cache: dict[int, list[int]] = {}
    out = []
    for i, line in enumerate(lines):
        rng = random.Random(f"trace-request/{seed}/{i}")
        prompt: list[int] = []
        for block_id in line.hash_ids[: math.ceil(line.input_length / block_tokens)]:
            prompt.extend(_block_tokens(cache, seed, block_id, block_tokens))  # more: unused
        del prompt[line.input_length :]
        prompt.extend(rng.randrange(VOCAB) for _ in range(line.input_length - len(prompt)))
        output = [rng.randrange(VOCAB) for _ in range(line.output_length)]
        arrival = (line.timestamp - start) * timestamp_s * time_scale
        out.append(SimRequest(f"trace-{i}", arrival, prompt, output))
    out.sort(key=lambda r: r.arrival_s)
    return out


def check_trace_units(block_tokens: int, timestamp_s: float) -> None:
    """`ConfigError` unless a trace block is 1..`MAX_TRACE_BLOCK` tokens and a timestamp
    unit a finite number of seconds > 0."""
    if not 1 <= block_tokens <= MAX_TRACE_BLOCK:
        raise ConfigError(
            f"--trace-block-tokens must be 1..{MAX_TRACE_BLOCK}, not {block_tokens} (the "
            "tokens one hash id of the trace stands for: 512 in Mooncake's traces)"
        )
    if not (math.isfinite(timestamp_s) and timestamp_s > 0):
        raise ConfigError(f"a trace timestamp unit must be seconds > 0, not {timestamp_s}")


def trace_records(
    requests: Iterable[SimRequest],
    block_tokens: int = TRACE_BLOCK,
    timestamp_s: float = TRACE_TIMESTAMP_S,
) -> Iterator[dict[str, Any]]:
    """Requests as Mooncake trace lines: ids numbered per distinct `block_tokens`-token
    prefix, timestamps in units of `timestamp_s` seconds."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    for r in requests:
        parent = -1
        chain = []
        for k in range(0, len(r.prompt), block_tokens):
            key = (parent, tuple(r.prompt[k : k + block_tokens]))
            parent = ids.setdefault(key, len(ids))
            chain.append(parent)
        yield {
            "timestamp": round(r.arrival_s / timestamp_s),
            "input_length": len(r.prompt),
            "output_length": len(r.output),
            "hash_ids": chain,
        }


def write_trace(
    path: str | Path,
    requests: Iterable[SimRequest],
    block_tokens: int = TRACE_BLOCK,
    timestamp_s: float = TRACE_TIMESTAMP_S,
) -> None:
    """Write `requests` as a Mooncake-format trace file (one JSON object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for record in trace_records(requests, block_tokens, timestamp_s):
            f.write(json.dumps(record) + "\n")

"""Production-trace replay: requests from a Mooncake-format trace (JSON lines).

Each line: `timestamp` (ms since the trace start), `input_length` and `output_length`
(tokens) and `hash_ids`, one id per 512-token block of the prompt, prefix-chained (equal
ids at equal positions mean equal prefixes), the format of the traces published with the
Mooncake FAST'25 paper. The trace has no tokens, so each id gets 512 synthetic tokens drawn
from a generator seeded by the id: requests sharing ids share tokens, so they share the
simulator's chained block hashes whatever the engine's block size. With `block_size` 512 one
trace block is one engine block; with 16, one trace block is 32 engine blocks (docs/simulator.md).
A prompt longer than its ids cover is padded with tokens of its own; the last id may cover
a partial block. `trace_records` writes requests back in this format (for generated traces).
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
"""Tokens per trace hash id (the Mooncake traces' block)."""


class TraceLine(msgspec.Struct):
    """One request of a Mooncake trace (unknown fields are ignored)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] = []


def _block_tokens(cache: dict[int, list[int]], seed: int, block_id: int) -> list[int]:
    tokens = cache.get(block_id)
    if tokens is None:
        rng = random.Random(f"trace-block/{seed}/{block_id}")
        tokens = cache[block_id] = [rng.randrange(VOCAB) for _ in range(TRACE_BLOCK)]
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
) -> list[SimRequest]:
    """Simulator requests for the first `limit` trace lines, arrivals times `time_scale`;
    a line of more than `max_tokens` is refused before its tokens are drawn."""
    if time_scale <= 0:
        raise ConfigError("--time-scale must be > 0")
    lines = read_trace(path, limit, max_tokens)
    start = min(line.timestamp for line in lines)
    cache: dict[int, list[int]] = {}
    out = []
    for i, line in enumerate(lines):
        rng = random.Random(f"trace-request/{seed}/{i}")
        prompt: list[int] = []
        for block_id in line.hash_ids[: math.ceil(line.input_length / TRACE_BLOCK)]:
            prompt.extend(_block_tokens(cache, seed, block_id))  # ids past the prompt: unused
        del prompt[line.input_length :]
        prompt.extend(rng.randrange(VOCAB) for _ in range(line.input_length - len(prompt)))
        output = [rng.randrange(VOCAB) for _ in range(line.output_length)]
        arrival = (line.timestamp - start) / 1000.0 * time_scale
        out.append(SimRequest(f"trace-{i}", arrival, prompt, output))
    out.sort(key=lambda r: r.arrival_s)
    return out


def trace_records(requests: Iterable[SimRequest]) -> Iterator[dict[str, Any]]:
    """Requests as Mooncake trace lines: ids numbered per distinct 512-token prefix."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    for r in requests:
        parent = -1
        chain = []
        for k in range(0, len(r.prompt), TRACE_BLOCK):
            key = (parent, tuple(r.prompt[k : k + TRACE_BLOCK]))
            parent = ids.setdefault(key, len(ids))
            chain.append(parent)
        yield {
            "timestamp": round(r.arrival_s * 1000),
            "input_length": len(r.prompt),
            "output_length": len(r.output),
            "hash_ids": chain,
        }


def write_trace(path: str | Path, requests: Iterable[SimRequest]) -> None:
    """Write `requests` as a Mooncake-format trace file (one JSON object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for record in trace_records(requests):
            f.write(json.dumps(record) + "\n")

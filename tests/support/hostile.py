"""Hostile Kafka record values for every stream: valid envelopes, mutated, and raw msgpack.

Used by the collector's hostile-record regression and fuzz tests. `valid_envelope` makes a
well-formed record of any stream; `hostile_values` the named attacks found against the
collector (each a value and a fragment of the `ingest_errors.reason` it must produce);
`fuzz_value` a random mutation of a valid record (which may still be valid: the fuzz test
then expects it stored, see `classify`).
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec
from kvscope.schemas import (
    AllBlocksCleared,
    BlockAccess,
    BlockRemoved,
    BlockStored,
    EngineMetric,
    EngineStats,
    Envelope,
    Gap,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
    encode,
)

T0 = 1_763_700_000.0
DEEP = 100_000
"""Nesting depth of the deep-nesting attack (far beyond the interpreter's recursion limit)."""


def valid_body(stream: str, rng: random.Random, ts: float) -> Any:
    """A well-formed body of `stream`."""
    if stream == "kv-events":
        events: list[Any] = [
            BlockStored(
                block_hashes=[rng.getrandbits(64) for _ in range(rng.randrange(1, 6))],
                parent_block_hash=rng.choice([None, rng.getrandbits(64)]),
                block_size=16,
                token_count=rng.randrange(1, 80),
            ),
            BlockRemoved(block_hashes=[rng.getrandbits(64) for _ in range(rng.randrange(0, 4))]),
        ]
        if rng.random() < 0.1:
            events.append(AllBlocksCleared())
        return KVEventBatch(ts=ts, events=events)
    if stream == "engine-stats":
        return EngineStats(capacity_blocks=1000, block_size=16, usage=rng.random(), running=3)
    if stream == "requests":
        return RequestFinished(request_id=f"r{rng.getrandbits(32)}", prompt_tokens=17, ttft_s=0.1)
    if stream == "kv-transfers":
        return KVTransfer(
            request_id=f"r{rng.getrandbits(32)}",
            src_instance="p0",
            dst_instance="d0",
            start_ts=ts,
            end_ts=ts + 0.01,
            latency_s=0.01,
        )
    if stream == "kv-accesses":
        return BlockAccess(
            request_id=f"r{rng.getrandbits(32)}",
            prompt_tokens=48,
            block_size=16,
            block_hashes=[rng.getrandbits(64) for _ in range(3)],
            hit_blocks=rng.randrange(0, 4),
            held_blocks=3,
            arrival_ts=ts,
            lookup_ts=ts,
            free_ts=ts + 0.5,
        )
    return EngineMetric(
        metric="vllm:nixl_xfer_time_seconds",
        labels={"model_name": "m"},
        bounds=[0.1, 1.0],
        bucket_deltas=[1, 2, 0],
        count_delta=3,
    )


def valid_envelope(
    stream: str, source: Source, epoch: int, seq: int, rng: random.Random
) -> Envelope:
    """A well-formed envelope of `stream` (engine timestamps near `T0`)."""
    ts = T0 + seq * 0.001
    return Envelope(source=source, epoch=epoch, seq=seq, ts=ts, body=valid_body(stream, rng, ts))


def _raw(envelope: Envelope) -> dict[str, Any]:
    """The envelope as plain msgpack data (to mutate)."""
    return msgspec.msgpack.decode(encode(envelope))


def _with_deep_field(raw: dict[str, Any]) -> bytes:
    """`raw` plus an unknown field holding `DEEP` nested one-element arrays."""
    marker = "__deep__"
    data = msgspec.msgpack.encode({**raw, marker: 0})
    at = data.rindex(b"\xa8" + marker.encode() + b"\x00")
    deep = b"\x91" * DEEP + b"\x00"
    return data[:at] + b"\xa8" + marker.encode() + deep + data[at + 10 :]


def _with_bad_utf8(raw: dict[str, Any]) -> bytes:
    """`raw` whose source.instance is not valid UTF-8."""
    marker = "\u2603INSTANCE\u2603"
    data = msgspec.msgpack.encode({**raw, "source": {**raw["source"], "instance": marker}})
    return data.replace(marker.encode(), b"\xff\xfe" + b"x" * (len(marker.encode()) - 2))


def hostile_values(stream: str, envelope: Envelope) -> list[tuple[str, bytes | None, str]]:
    """(name, value, reason fragment) of every named attack on a record of `stream`."""
    raw = _raw(envelope)
    src = raw["source"]
    gap = _raw(
        Envelope(
            source=envelope.source,
            epoch=envelope.epoch,
            seq=envelope.seq,
            ts=envelope.ts,
            body=Gap(first_seq=1, last_seq=2),
        )
    )
    attacks: list[tuple[str, bytes | None, str]] = [
        ("deep nesting", b"\x91" * DEEP + b"\x00", "nested too deeply"),
        ("deep unknown field", _with_deep_field(raw), "nested too deeply"),
        ("invalid utf-8 instance", _with_bad_utf8(raw), "not valid UTF-8"),
        ("tombstone", None, "tombstone"),
        ("huge claimed length", b"\xdb\xff\xff\xff\xf0abc", "truncated"),
        (
            "dp_rank 70000",
            msgspec.msgpack.encode({**raw, "source": {**src, "dp_rank": 70000}}),
            "dp_rank 70000",
        ),
        (
            "gap dp_rank 70000",
            msgspec.msgpack.encode({**gap, "source": {**src, "dp_rank": 70000}}),
            "dp_rank 70000",
        ),
        (
            "huge instance",
            msgspec.msgpack.encode({**raw, "source": {**src, "instance": "i" * 10**6}}),
            "source.instance has 1000000 characters",
        ),
        (
            "seq 2^64-1",
            msgspec.msgpack.encode({**raw, "seq": 2**64 - 1}),
            "seq 18446744073709551615",
        ),
        (
            "gap first > last",
            msgspec.msgpack.encode({**gap, "body": {**gap["body"], "first_seq": 9, "last_seq": 3}}),
            "first_seq 9 > last_seq 3",
        ),
        (
            "gap last 2^64-1",
            msgspec.msgpack.encode({**gap, "body": {**gap["body"], "last_seq": 2**64 - 1}}),
            "last_seq 18446744073709551615",
        ),
    ]
    for ts in (math.nan, math.inf, -math.inf, 1e300, -1.0):
        attacks.append((f"ts {ts}", msgspec.msgpack.encode({**raw, "ts": ts}), "outside"))
    if stream == "kv-events":
        ones = {"type": "BlockRemoved", "block_hashes": [1] * 150_000}
        attacks.append(
            (
                "row amplification",
                msgspec.msgpack.encode({**raw, "body": {**raw["body"], "events": [ones]}}),
                "block_hashes",
            )
        )
        split = [{"type": "BlockRemoved", "block_hashes": [1] * 60_000}] * 2
        attacks.append(
            (
                "rows over the record limit",
                msgspec.msgpack.encode({**raw, "body": {**raw["body"], "events": split}}),
                "120000 rows",
            )
        )
        lora = {"type": "BlockStored", "block_hashes": [5], "lora_name": "l" * 5000}
        attacks.append(
            (
                "huge lora name",
                msgspec.msgpack.encode({**raw, "body": {**raw["body"], "events": [lora]}}),
                "lora_name",
            )
        )
    else:
        other = "requests" if stream != "requests" else "engine-stats"
        wrong = Envelope(
            source=envelope.source,
            epoch=envelope.epoch,
            seq=envelope.seq,
            ts=envelope.ts,
            body=valid_body(other, random.Random(0), envelope.ts),
        )
        attacks.append(("wrong-stream body", encode(wrong), "does not belong"))
    return attacks


_NUMBERS = (-1, 2**16, 2**32, 2**63, 2**64 - 1, math.nan, math.inf, -math.inf, 1e300, "x", None)


def _mutate_field(data: Any, rng: random.Random) -> Any:
    """Replace one randomly chosen leaf (or a whole map or list) with a hostile value."""
    if isinstance(data, dict) and data:
        key = rng.choice(list(data))
        if rng.random() < 0.7:
            return {**data, key: _mutate_field(data[key], rng)}
        return {**data, key: _hostile_leaf(rng)}
    if isinstance(data, list) and data:
        i = rng.randrange(len(data))
        return [*data[:i], _mutate_field(data[i], rng), *data[i + 1 :]]
    return _hostile_leaf(rng)


def _hostile_leaf(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(_NUMBERS)
    if roll < 0.7:
        return "s" * rng.choice([0, 300, 5000, 100_000])
    if roll < 0.85:
        return [rng.choice(_NUMBERS)] * rng.choice([0, 1, 2000])
    return {"type": rng.choice(["KVEvents", "Gap", "Mystery", "BlockStored"])}


def fuzz_value(envelope: Envelope, rng: random.Random) -> bytes | None:
    """A random mutation of `envelope`'s record value (bytes-level or field-level)."""
    value = encode(envelope)
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.25:
        flipped = bytearray(value)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    if roll < 0.35:
        return value[: rng.randrange(len(value))]
    if roll < 0.4:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
    raw = _raw(envelope)
    if roll < 0.7:
        return msgspec.msgpack.encode({**raw, "body": _mutate_field(raw["body"], rng)})
    return msgspec.msgpack.encode(_mutate_field(raw, rng))

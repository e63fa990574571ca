"""Envelope encode/decode: round trips of every body, and DecodeError messages."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from kvscope.schemas import (
    SCHEMA_VERSION,
    AllBlocksCleared,
    AnyBody,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EngineStats,
    Envelope,
    Gap,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
    decode,
    decode_engine_payload,
    encode,
)

TOP = 2**64 - 1
SOURCE = Source(
    instance="gpu-node-7:8000 ✓",
    model="llama-3-8b/δ",
    role="prefill",
    dp_rank=3,
    engine="vllm",
    engine_version="0.32.0",
)
BODIES: dict[str, AnyBody] = {
    "kv-events": KVEventBatch(
        ts=1_795_253_137.281,
        events=[
            BlockStored(
                block_hashes=[0, 2**63, TOP],
                parent_block_hash=2**63 + 1,
                block_size=32,
                token_count=96,
                medium="CPU",
                medium_raw="CPU_PINNED",
                lora_id=-1,
                lora_name="adapter-ü",
                group_idx=0,
                token_ids=[0, 1, 2**31],
            ),
            BlockStored(block_hashes=[]),
            BlockRemoved(block_hashes=[TOP], medium="DISK", medium_raw="STORAGE", group_idx=2),
            AllBlocksCleared(),
        ],
        dp_rank=0,
    ),
    "kv-events-empty": KVEventBatch(ts=0.0, events=[]),
    "engine-stats": EngineStats(
        capacity_blocks=TOP,
        block_size=16,
        usage=1.0,
        running=4,
        waiting=0,
        prefix_queries_delta=2**63,
        prefix_hits_delta=0,
        preemptions_delta=1,
        interval_s=5e-324,
    ),
    "request": RequestFinished(
        request_id="req-日本語-🙂",
        prompt_tokens=1024,
        cached_tokens=512,
        output_tokens=1,
        ttft_s=1.7976931348623157e308,
        queue_s=-0.0,
        prefill_s=0.1,
        decode_s=0.0,
        e2e_s=2.5,
        finish_reason="length",
    ),
    "kv-transfer": KVTransfer(
        request_id="r1",
        src_instance="prefill-0",
        dst_instance="decode-1",
        backend="nixl",
        bytes=TOP,
        blocks=40,
        chunks=3,
        start_ts=1.0,
        end_ts=1.25,
        latency_s=0.25,
        status="aborted",
    ),
    "gap": Gap(first_seq=0, last_seq=TOP, reason=""),
}


def _envelope(body: AnyBody, **fields: Any) -> Envelope:
    values = {"source": SOURCE, "epoch": TOP, "seq": 2**63, "ts": 1e-9, "body": body}
    return Envelope(**(values | fields))


@pytest.mark.parametrize("name", sorted(BODIES))
def test_round_trip_every_body(name: str) -> None:
    envelope = _envelope(BODIES[name])
    data = encode(envelope)
    assert isinstance(data, bytes)
    assert decode(data) == envelope
    assert encode(decode(data)) == data


def test_round_trip_minimal_source_and_defaults() -> None:
    envelope = Envelope(source=Source(instance=""), epoch=0, seq=0, ts=0.0, body=Gap(0, 0))
    decoded = decode(encode(envelope))
    assert decoded == envelope and decoded.schema == SCHEMA_VERSION
    assert decoded.source.key == "/0"


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_timestamps_survive(value: float) -> None:
    decoded = decode(encode(_envelope(KVEventBatch(ts=value, events=[]), ts=value)))
    assert math.isnan(decoded.ts) if math.isnan(value) else decoded.ts == value


def test_unknown_fields_are_ignored() -> None:
    """A newer publisher of the same schema may add optional fields anywhere."""
    raw = msgspec.to_builtins(_envelope(BODIES["gap"]))
    raw["new_top_level"] = {"x": [1, 2]}
    raw["source"]["zone"] = "eu-1"
    raw["body"]["hint"] = 7
    assert decode(msgspec.msgpack.encode(raw)) == _envelope(BODIES["gap"])


def _raw(**overrides: Any) -> bytes:
    raw = msgspec.to_builtins(_envelope(BODIES["gap"]))
    return msgspec.msgpack.encode(raw | overrides)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encode(_envelope(BODIES["kv-events"]))[:-5], r"^truncated"),
        (b"", r"^truncated"),
        (b"\xc1\x00", r"^not msgpack"),
        (b'{"schema": 1}', r"^not msgpack"),
        (b"\x91" * 100_000 + b"\xc0", r"^not msgpack: nested too deeply"),
        (msgspec.msgpack.encode([1, 2, 3]), r"^not an envelope: the record is a msgpack list"),
        (_raw(body={"type": "Snapshot", "blocks": []}), r"^unknown body type 'Snapshot'$"),
        (_raw(schema=SCHEMA_VERSION + 1), rf"^newer schema {SCHEMA_VERSION + 1}\b"),
        (_raw(schema=9, body={"type": "Future"}), r"^newer schema 9\b"),
        (_raw(seq="7"), r"^wrong type or value at field `seq`: Expected `int`, got `str`$"),
        (_raw(seq=-1), r"^wrong type or value at field `seq`: Expected `int` >= 0$"),
        (_raw(epoch=None), r"at field `epoch`: Expected `int`, got `None`"),
        (
            _raw(source={"instance": "a", "dp_rank": "x"}),
            r"at field `source.dp_rank`: Expected `int`, got `str`",
        ),
        (
            _raw(body={"type": "KVEvents", "ts": 1.0, "events": [{"type": "BlockStored"}]}),
            r"at field `body.events\[0\]`: Object missing required field `block_hashes`",
        ),
        (
            _raw(body={"type": "EngineStats", "capacity_blocks": 1, "block_size": 1, "usage": 2}),
            r"at field `body.usage`: Expected `float` <= 1.0",
        ),
        (_raw(body={"type": "Gap", "first_seq": 1}), r"missing required field `last_seq`"),
        (
            msgspec.msgpack.encode({"source": {"instance": "a"}, "seq": 1}),
            r"^invalid envelope: Object missing required field `epoch`$",
        ),
        (b"\xa2\xff\xfe", r"^not msgpack: a string is not valid UTF-8"),
    ],
    ids=[
        "truncated",
        "empty",
        "invalid-opcode",
        "json",
        "deep-nesting",
        "array",
        "unknown-body",
        "newer-schema",
        "newer-schema-unknown-body",
        "seq-str",
        "seq-negative",
        "epoch-null",
        "source-dp-rank",
        "event-missing-field",
        "usage-out-of-range",
        "gap-missing-field",
        "missing-epoch",
        "bad-utf8",
    ],
)
def test_decode_errors_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(data)


def test_decode_error_is_permanent_and_has_no_chained_cause() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"\xc1")
    assert info.value.retriable is False
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_payload_nested_too_deeply_in_metadata(engine: str) -> None:
    """SGLang's trailing metadata map may hold anything; absurd nesting is a DecodeError."""
    base = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [1], None, [], 4, None, "GPU", {"salt": "@@@@"}]]]
    )
    assert decode_engine_payload(base, engine).events[0].block_hashes == [1]
    deep = base.replace(b"\xa4@@@@", b"\x91" * 100_000 + b"\xc0")
    with pytest.raises(DecodeError, match=f"^{engine} payload: "):
        decode_engine_payload(deep, engine)

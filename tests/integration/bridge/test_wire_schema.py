"""A non-Python consumer's path: real records -> msgpack -> JSON -> `kvscope schema` validation."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest
from kvscope.cli.commands.schema import envelope_json_schema
from kvscope.cli.main import main
from kvscope.consumer import read_envelopes
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.kafka import KafkaPublisher
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineMetric,
    EngineStats,
    Gap,
    KVEventBatch,
    KVTransfer,
    RequestFinished,
    Source,
)

BIG_HASH = (1 << 64) - 5  # above 2**63: must survive msgpack -> JSON as an exact integer

BODIES = [
    KVEventBatch(
        ts=1_700_000_000.5,
        events=[
            BlockStored(
                block_hashes=[BIG_HASH, 7],
                parent_block_hash=(1 << 63) + 1,
                block_size=16,
                token_count=32,
                medium="CPU",
                medium_raw="CPU_PINNED",
                lora_name="adapter",
            ),
            BlockRemoved(block_hashes=[BIG_HASH], medium="GPU"),
            AllBlocksCleared(),
        ],
        dp_rank=1,
    ),
    EngineStats(capacity_blocks=1024, block_size=16, usage=0.25, prefix_queries_delta=100),
    RequestFinished(request_id="r-1", prompt_tokens=40, cached_tokens=32, ttft_s=0.01),
    KVTransfer(request_id="r-1", src_instance="p:1", dst_instance="d:1", bytes=1 << 40),
    EngineMetric(
        metric="vllm:nixl_xfer_time_seconds",
        labels={"model_name": "m", "engine": "0"},
        bounds=[0.001, 0.01],
        bucket_deltas=[1, 2, 0],
        sum_delta=0.012,
        count_delta=3,
        interval_s=10.0,
    ),
    Gap(first_seq=0, last_seq=2, reason="replay_missing"),
]


def test_kvscope_schema_prints_the_envelope_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == envelope_json_schema()
    jsonschema.Draft202012Validator.check_schema(printed)


def test_real_records_validate_as_json_and_decode_with_the_consumer(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, linger_ms=2)
    )
    source = Source(instance="10.0.0.5:8000", model="tiny", role="decode", dp_rank=1)
    pub = kafka.for_source(source, epoch=(1 << 64) - 1)
    for body in BODIES:
        pub.publish(body, ts=1_700_000_001.0)
    assert kafka.shutdown(10)

    records = read_envelopes(bootstrap_servers, topic_prefix=topic_prefix)
    assert len(records) == len(BODIES)  # the Gap body becomes the publisher's Gap record
    validator = jsonschema.Draft202012Validator(envelope_json_schema())
    for record in records:
        assert record.key == "10.0.0.5:8000/1"
        as_json = json.loads(json.dumps(msgspec.msgpack.decode(record.value)))
        validator.validate(as_json)
        assert as_json["epoch"] == (1 << 64) - 1
        assert msgspec.convert(as_json, type(record.envelope)) == record.envelope
    bodies = [r.envelope.body for r in records]
    by_type = {type(b): b for b in bodies if not isinstance(b, Gap)}  # topics interleave
    assert [by_type[type(b)] for b in BODIES[:-1]] == BODIES[:-1]
    gaps = [b for b in bodies if isinstance(b, Gap)]
    assert [(g.last_seq - g.first_seq, g.reason) for g in gaps] == [(2, "replay_missing")]
    batch = next(j for j in bodies if isinstance(j, KVEventBatch))
    assert batch.events[0].block_hashes[0] == BIG_HASH


def test_the_schema_rejects_what_a_decoder_would_reject() -> None:
    validator = jsonschema.Draft202012Validator(envelope_json_schema())
    good = json.loads(
        msgspec.json.encode(
            {"source": {"instance": "a"}, "epoch": 1, "seq": 0, "ts": 1.0, "body": BODIES[1]}
        )
    )
    validator.validate(good)
    for broken in (
        {**good, "seq": -1},
        {**good, "body": {**good["body"], "type": "NoSuchBody"}},
        {k: v for k, v in good.items() if k != "source"},
        {**good, "body": {**good["body"], "usage": 2.0}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(broken)

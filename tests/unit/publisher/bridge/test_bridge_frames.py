"""ZMQ frame shapes of vLLM and SGLang (live and replay) and llm-d topics."""

from __future__ import annotations

import msgspec
import pytest
from kvscope.publisher.bridge.frames import (
    END_SEQ,
    Frame,
    encode_seq,
    parse_live,
    parse_replay,
    parse_topic,
)
from kvscope.publisher.bridge.loop import BridgeConfig, Endpoint, EndpointLink, gap_reason
from kvscope.publisher.bridge.seq import SeqRepair
from kvscope.publisher.bridge.state import BridgeState
from kvscope.schemas import ConfigError, KVEventBatch, Source
from prometheus_client import REGISTRY

BIG = (1 << 63) + 5


class Published:
    """A recording publisher factory: every (source, body) the bridge publishes, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[Source, object]] = []

    def source(self, source: Source) -> Published.Handle:
        """`KafkaPublisher.for_source`'s stand-in."""
        return Published.Handle(self, source)

    class Handle:
        """One source's publisher."""

        epoch = 1

        def __init__(self, owner: Published, source: Source) -> None:
            self._owner, self._source = owner, source

        def publish(self, body: object, ts: float | None = None) -> None:
            """Record the body under this handle's source."""
            self._owner.records.append((self._source, body))


def test_live_frames_carry_topic_seq_and_payload() -> None:
    assert parse_live([b"kv@1.2.3.4:8000@m", encode_seq(BIG), b"x"]) == Frame(
        BIG, "kv@1.2.3.4:8000@m", b"x"
    )
    for bad in ([b"", b"\x00" * 7, b"x"], [b"", encode_seq(1)]):
        with pytest.raises(ValueError):
            parse_live(bad)


def test_replay_answers_in_both_engine_shapes() -> None:
    assert parse_replay([b"t", encode_seq(3), b"p"]) == Frame(3, "t", b"p")  # vLLM 0.32
    assert parse_replay([encode_seq(3), b"p"]) == Frame(3, "", b"p")  # older releases
    assert parse_replay([b"", END_SEQ, b""]) is None  # vLLM 0.32 end marker
    assert parse_replay([END_SEQ, b""]) is None  # older end marker
    with pytest.raises(ValueError):
        parse_replay([b"only one"])


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("kv@10.0.0.5:8000@meta-llama/Llama-3.1-8B", ("10.0.0.5:8000", "meta-llama/Llama-3.1-8B")),
        ("kv@pod:1@model@with@ats", ("pod:1", "model@with@ats")),
        ("kv@tiny-llama", None),
        ("", None),
        ("events@a@b", None),
    ],
)
def test_llm_d_topics(topic: str, expected: tuple[str, str] | None) -> None:
    parsed = parse_topic(topic)
    assert (tuple(parsed) if parsed else None) == expected


def test_sglang_topic_metadata_is_not_part_of_the_model() -> None:
    """SGLang with a snapshot endpoint (sglang#34407) sends `topic\\x00sgl-kv-epoch=<hex>`."""
    topic = b"kv@10.0.0.5:30000@Qwen/Qwen3-8B"
    live = topic + b"\x00sgl-kv-epoch=" + b"ab" * 16
    barrier = live + b"\x00sgl-kv-snapshot=" + b"cd" * 16
    payload = msgspec.msgpack.encode([1.0, [], 0])
    published = Published()
    config = BridgeConfig(engine="sglang", endpoints=[Endpoint(zmq="tcp://x:1")])
    link = EndpointLink(config, config.endpoints[0], published.source, BridgeState(None))
    for seq, raw_topic in enumerate((live, barrier)):
        frame = parse_live([raw_topic, encode_seq(seq), payload])
        assert frame.topic == topic.decode()
        link.see_topic(frame.topic)
        link.forward(frame)
    assert [(s.instance, s.model) for s, _ in published.records] == [
        ("10.0.0.5:30000", "Qwen/Qwen3-8B")
    ] * 2
    assert parse_replay([live, encode_seq(0), payload]) == Frame(0, topic.decode(), payload)


@pytest.mark.parametrize("configured_rank", [None, 5])
def test_a_loss_before_the_first_batch_takes_the_batchs_dp_rank(
    configured_rank: int | None,
) -> None:
    """A late bridge on DP rank 3 whose replay ring no longer holds seqs 0-4: the Gap for them
    must be under the rank the batches carry, not rank 0 (unless --dp-rank says otherwise)."""
    published = Published()
    config = BridgeConfig(endpoints=[Endpoint(zmq="tcp://x:1", dp_rank=configured_rank)])
    link = EndpointLink(config, config.endpoints[0], published.source, BridgeState(None))
    payload = msgspec.msgpack.encode([1.0, [["BlockRemoved", [7], None]], 3])
    ring = [Frame(seq, "", payload) for seq in range(5, 8)]
    SeqRepair(link, lambda start: ring).catch_up()
    link.settle()
    link.lost(8, 8, "undecodable")  # a later loss goes straight out under the same source
    expected = 3 if configured_rank is None else configured_rank
    assert [(s.dp_rank, type(body).__name__) for s, body in published.records] == [
        (expected, "Gap"),
        *[(expected, "KVEventBatch")] * 3,
        (expected, "Gap"),
    ]
    assert len({id(s) for s, _ in published.records}) == 1  # one source, one epoch


def test_an_unknown_event_type_is_counted_and_its_batch_forwarded() -> None:
    published = Published()
    config = BridgeConfig(endpoints=[Endpoint(zmq="tcp://unknown-events:1")])
    link = EndpointLink(config, config.endpoints[0], published.source, BridgeState(None))
    events = [{"type": "BlockTransferred", "block_hashes": [1]}, ["BlockRemoved", [7], "GPU"]]
    link.forward(Frame(0, "", msgspec.msgpack.encode([1.0, events, 0])))
    ((_, batch),) = published.records
    assert isinstance(batch, KVEventBatch) and batch.events[0].block_hashes == [7]  # type: ignore[union-attr]
    counted = REGISTRY.get_sample_value(
        "kvscope_bridge_unknown_events_total", {"endpoint": "tcp://unknown-events:1"}
    )
    assert (counted, link.lost_batches, link.forwarded) == (1.0, 0, 1)


def test_held_gaps_are_settled_under_the_endpoints_rank() -> None:
    published = Published()
    config = BridgeConfig(endpoints=[Endpoint(zmq="tcp://x:1")])
    link = EndpointLink(config, config.endpoints[0], published.source, BridgeState(None))
    link.lost(0, 0, "replay_missing")
    assert published.records == []
    link.settle()
    assert [(s.dp_rank, body.reason) for s, body in published.records] == [  # type: ignore[attr-defined]
        (0, "replay_missing engine_seq=0-0")
    ]


def test_config_is_validated_before_any_socket() -> None:
    with pytest.raises(ConfigError):
        BridgeConfig(endpoints=[]).validate()
    with pytest.raises(ConfigError):
        BridgeConfig(endpoints=[Endpoint(zmq="http://x:1")]).validate()
    with pytest.raises(ConfigError):
        BridgeConfig(engine="trt", endpoints=[Endpoint(zmq="tcp://x:1")]).validate()  # type: ignore[arg-type]
    assert BridgeConfig(endpoints=[Endpoint(zmq="tcp://x:1", replay="tcp://x:2")]).validate()


def test_gap_reason_names_the_engine_seqs() -> None:
    assert gap_reason("replay_missing", 15, 25) == "replay_missing engine_seq=15-25"


def test_state_file_round_trip_and_only_saved_positions_survive(tmp_path) -> None:
    state = BridgeState(tmp_path)
    state.set("tcp://a:1", 10)
    snapshot = state.snapshot()
    state.set("tcp://a:1", 12)  # published after the snapshot: not yet known to be in Kafka
    state.save(snapshot)
    assert BridgeState(tmp_path).get("tcp://a:1") == 10
    assert BridgeState(tmp_path).get("tcp://b:1") is None
    assert BridgeState(None).get("tcp://a:1") is None

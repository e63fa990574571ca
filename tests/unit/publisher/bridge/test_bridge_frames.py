"""ZMQ frame shapes of vLLM and SGLang (live and replay) and llm-d topics."""

from __future__ import annotations

import pytest
from kvscope.publisher.bridge.frames import (
    END_SEQ,
    Frame,
    encode_seq,
    parse_live,
    parse_replay,
    parse_topic,
)
from kvscope.publisher.bridge.loop import BridgeConfig, Endpoint, gap_reason
from kvscope.schemas import ConfigError

BIG = (1 << 63) + 5


def test_live_frames_carry_topic_seq_and_payload() -> None:
    assert parse_live([b"kv@1.2.3.4:8000@m", encode_seq(BIG), b"x"]) == Frame(
        BIG, "kv@1.2.3.4:8000@m", b"x"
    )
    for bad in ([b"", b"\x00" * 7, b"x"], [b"", encode_seq(1)]):
        with pytest.raises(ValueError):
            parse_live(bad)


def test_replay_answers_in_both_engine_shapes() -> None:
    assert parse_replay([b"t", encode_seq(3), b"p"]) == Frame(3, "t", b"p")  # vLLM
    assert parse_replay([encode_seq(3), b"p"]) == Frame(3, "", b"p")  # SGLang
    assert parse_replay([b"", END_SEQ, b""]) is None  # vLLM end marker
    assert parse_replay([END_SEQ, b""]) is None  # SGLang end marker
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
    from kvscope.publisher.bridge.state import BridgeState

    state = BridgeState(tmp_path)
    state.set("tcp://a:1", 10)
    snapshot = state.snapshot()
    state.set("tcp://a:1", 12)  # published after the snapshot: not yet known to be in Kafka
    state.save(snapshot)
    assert BridgeState(tmp_path).get("tcp://a:1") == 10
    assert BridgeState(tmp_path).get("tcp://b:1") is None
    assert BridgeState(None).get("tcp://a:1") is None

"""The relay's engine side without Kafka: settings, the wire, acks from a real ZMQ peer,
and no aiokafka in an engine process that uses a relay."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from kvscope.publisher import KafkaPublisher, PublisherConfig
from kvscope.publisher.relay.config import RelayConfig
from kvscope.publisher.relay.service import loss_ranges
from kvscope.publisher.relay_client import ACK_POLL_S, RelayAck, RelayBatch, RelayLoss
from kvscope.publisher.vllm.switch import parse_endpoint
from kvscope.schemas import BlockStored, ConfigError, Gap, KVEventBatch, Source, decode
from prometheus_client import REGISTRY


@pytest.mark.parametrize(
    "address", ["ipc:///run/kvscope/relay.sock", "tcp://127.0.0.1:5600", "tcp://[::1]:5600"]
)
def test_relay_addresses_accepted(address: str) -> None:
    config = PublisherConfig(bootstrap_servers="b:9092", relay=address).validate()
    assert config.relay == address


@pytest.mark.parametrize(
    "address", ["relay.sock", "udp://127.0.0.1:5600", "ipc://", "tcp://127.0.0.1", "tcp://:80"]
)
def test_bad_relay_addresses_are_one_line_errors(address: str) -> None:
    with pytest.raises(ConfigError, match="KVSCOPE_RELAY") as caught:
        PublisherConfig(bootstrap_servers="b:9092", relay=address).validate()
    assert "\n" not in str(caught.value)


def test_relay_from_the_environment_and_the_one_switch() -> None:
    env = {"KVSCOPE_BOOTSTRAP_SERVERS": "b:9092", "KVSCOPE_RELAY": "ipc:///tmp/r.sock"}
    assert PublisherConfig.from_env(env).relay == "ipc:///tmp/r.sock"
    switch = parse_endpoint("kafka://b:9092?relay=ipc:///run/kvscope/relay.sock", environ={})
    assert switch.config.relay == "ipc:///run/kvscope/relay.sock"


@pytest.mark.parametrize(
    ("listen", "allow_remote", "ok"),
    [
        ("ipc:///tmp/x.sock", False, True),
        ("tcp://127.0.0.1:5600", False, True),
        ("tcp://0.0.0.0:5600", False, False),
        ("tcp://*:5600", False, False),
        ("tcp://10.0.0.5:5600", True, True),
    ],
)
def test_relay_listen_is_loopback_unless_allowed(listen: str, allow_remote: bool, ok: bool) -> None:
    config = RelayConfig(
        listen=listen,
        allow_remote=allow_remote,
        producer=PublisherConfig(bootstrap_servers="b:9092"),
    )
    if ok:
        assert config.validate() is config
    else:
        with pytest.raises(ConfigError, match="allow-remote"):
            config.validate()


def test_relay_needs_brokers() -> None:
    with pytest.raises(ConfigError, match="bootstrap-servers"):
        RelayConfig().validate()


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([None, None], []),
        (["x", "x", None, "x"], [(0, 1, "x"), (3, 3, "x")]),
        (["a", "b", "b", "a"], [(0, 0, "a"), (1, 2, "b"), (3, 3, "a")]),
        ([None] * 5 + ["relay_full"] * 1000, [(5, 1004, "relay_full")]),
    ],
)
def test_acks_name_lost_records_as_ranges(
    outcomes: list[str | None], expected: list[tuple[int, int, str]]
) -> None:
    ack = RelayAck(7, loss_ranges(outcomes))
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(ack), type=RelayAck)
    assert [(loss.first, loss.last, loss.reason) for loss in decoded.lost] == expected


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(("count", "lost"), [(10, (3, 4)), (40, (0, 39)), (25, (24, 24))])
def test_ack_losses_are_booked_and_the_rest_published(
    tmp_path: Path, count: int, lost: tuple[int, int]
) -> None:
    """A real ZMQ ROUTER stands in for the relay: it acks the first batch with one loss
    and then gets the Gap that reports it (the next batch)."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    address = f"ipc://{tmp_path}/relay.sock"
    router.bind(address)
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers="b:9092", relay=address, linger_ms=200.0, queue_size=100)
    )
    try:
        published = _sample("kvscope_publisher_published_total", {"stream": "kv-events"})
        failed = _sample(
            "kvscope_publisher_dropped_total", {"stream": "kv-events", "reason": "send_failed"}
        )
        publisher = kafka.for_source(Source(instance="unit"))
        for i in range(count):
            publisher.publish(
                KVEventBatch(ts=time.time(), events=[BlockStored(block_hashes=[i], block_size=16)])
            )
        assert router.poll(10_000), "the sender sent nothing"
        identity, payload = router.recv_multipart()
        batch = msgspec.msgpack.decode(payload, type=RelayBatch)
        assert [r.key for r in batch.records] == [b"unit/0"] * count
        assert {r.topic for r in batch.records} == {kafka.topic("kv-events")}
        first, last = lost
        ack = RelayAck(batch.id, [RelayLoss(first, last, "send_failed")])
        router.send_multipart([identity, msgspec.msgpack.encode(ack)])
        assert router.poll(10_000), "no Gap came"
        gap_batch = msgspec.msgpack.decode(router.recv_multipart()[1], type=RelayBatch)
        gaps = [decode(r.value).body for r in gap_batch.records]
        assert gaps == [Gap(first_seq=first, last_seq=last, reason="send_failed")]
        after = _sample("kvscope_publisher_published_total", {"stream": "kv-events"})
        assert after - published == count - (last - first + 1)
        dropped = {"stream": "kv-events", "reason": "send_failed"}
        assert _sample("kvscope_publisher_dropped_total", dropped) - failed == last - first + 1
    finally:
        kafka.shutdown(0.5)
        router.close(0)
        context.term()


def test_a_relay_mode_engine_never_imports_aiokafka(tmp_path: Path) -> None:
    script = f"""
import json, sys, time
from kvscope.publisher import KafkaPublisher, PublisherConfig
from kvscope.schemas import KVEventBatch, Source
kafka = KafkaPublisher(PublisherConfig(
    bootstrap_servers="b:9092", relay="ipc://{tmp_path}/none.sock", linger_ms=1.0))
kafka.for_source(Source(instance="x")).publish(KVEventBatch(ts=time.time(), events=[]))
kafka.flush(0.5)
alive = kafka.sender_alive()
kafka.shutdown(0.5)
print(json.dumps([alive, sorted(m for m in sys.modules if m.split(".")[0] == "aiokafka")]))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    alive, loaded = json.loads(result.stdout.splitlines()[-1])
    assert alive is True, "the relay sender ran"
    assert loaded == []


@pytest.mark.parametrize("linger_ms", [0.0, 5.0])
def test_waiting_for_an_ack_does_not_spin(tmp_path: Path, linger_ms: float) -> None:
    """A relay (a real ROUTER) that takes a batch and never acks: the sender looks for the
    ack every `ACK_POLL_S` at most, so half a second holds ~10 rounds, not thousands."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    address = f"ipc://{tmp_path}/relay.sock"
    router.bind(address)
    kafka = KafkaPublisher(
        PublisherConfig(bootstrap_servers="b:9092", relay=address, linger_ms=linger_ms)
    )
    try:
        kafka.for_source(Source(instance="spin")).publish(KVEventBatch(ts=time.time(), events=[]))
        assert router.poll(10_000), "the sender sent nothing"
        router.recv_multipart()
        before = kafka.sender_rounds()
        time.sleep(0.5)
        assert kafka.sender_rounds() - before <= 0.5 / ACK_POLL_S + 5
    finally:
        kafka.shutdown(0.2)
        router.close(0)
        context.term()

"""Sidecar mode with vLLM's own publisher: the DP offset, four DP ranks, a real engine.

The ground truth is what vLLM published on ZMQ; the other side is what the bridge child
the plugin started sent to Kafka (read back, or stored by the real collector).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kvscope.consumer import read_envelopes
from kvscope.local.broker import free_port
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.vllm import plugin
from kvscope.publisher.vllm.kv_events import KvscopeSidecarPublisher, sidecar_constructor
from kvscope.publisher.vllm.sidecar import dp_endpoint
from kvscope.schemas import ConfigError, Gap, KVEventBatch
from support.e2e_support import collect, wait_for
from support.procfs import is_running
from support.vllm_e2e import (
    ZmqCapture,
    assert_same_blocks_as_zmq,
    distinct,
    plugin_env,
    read_until,
    start_engine_proc,
    stop,
)
from vllm.config import KVEventsConfig
from vllm.distributed import kv_events
from vllm.distributed.kv_events import EventPublisherFactory

pytestmark = pytest.mark.vllm
RANKS = (0, 1, 2, 3)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize(
    "endpoint",
    ["tcp://*:5557", "tcp://*:0", "tcp://0.0.0.0:6000", "tcp://10.0.0.5:5557", "inproc://c"],
)
def test_dp_offset_is_vllms(endpoint: str, rank: int) -> None:
    assert dp_endpoint(endpoint, rank) == kv_events.ZmqEventPublisher.offset_endpoint_port(
        endpoint, rank
    )


@pytest.mark.parametrize("rank", RANKS)
def test_dp_offset_of_ipc_fails_like_vllm(rank: int) -> None:
    if rank == 0:
        assert dp_endpoint("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"
        return
    with pytest.raises(ValueError):
        kv_events.ZmqEventPublisher.offset_endpoint_port("ipc:///tmp/kv", rank)
    with pytest.raises(ConfigError):
        dp_endpoint("ipc:///tmp/kv", rank)


@pytest.fixture
def sidecar_plugin(
    monkeypatch: pytest.MonkeyPatch, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The plugin registered in sidecar mode (vLLM's registry restored afterwards)."""
    for name, value in {
        "BOOTSTRAP_SERVERS": bootstrap_servers, "TOPIC_PREFIX": topic_prefix,
        "INSTANCE": "pod-9:8000", "MODEL": "tiny", "ROLE": "decode", "KV_EVENTS_SIDECAR": "yes",
    }.items():  # fmt: skip
        monkeypatch.setenv(f"KVSCOPE_{name}", value)
    registry = EventPublisherFactory._registry
    monkeypatch.setitem(registry, "zmq", registry["zmq"])
    plugin.register()


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:{port}", "tcp://127.0.0.1:{port}"])
def test_plugin_refuses_an_endpoint_vllm_connects_to(sidecar_plugin: None, endpoint: str) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint.format(port=free_port())
    )
    with pytest.raises(ConfigError, match="needs vLLM to bind"):
        EventPublisherFactory.create(config)


def test_plugin_in_sidecar_mode_builds_the_sidecar(sidecar_plugin: None, tmp_path: Path) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=f"ipc://{tmp_path}/pub"
    )
    publisher = EventPublisherFactory.create(config)
    try:
        assert isinstance(publisher, KvscopeSidecarPublisher)
        command = publisher.supervisor.command
        for flag in ("--instance=pod-9:8000", "--model=tiny", "--role=decode", "--dp-rank=0"):
            assert flag in command
        assert f"--zmq=ipc://{tmp_path}/pub" in command
        assert not any(part.startswith("--replay") for part in command)
        wait_for(lambda: publisher.supervisor.pid is not None, 30, "the bridge child")
        child = publisher.supervisor.pid
    finally:
        publisher.shutdown()
    assert child is not None and not is_running(child)


def stored(rank: int, i: int) -> kv_events.KVEventBatch:
    """One batch of one stored block (the rank is set by vLLM's publisher)."""
    block = kv_events.BlockStored(
        block_hashes=[1000 * rank + i], parent_block_hash=None, token_ids=[1] * 16,
        block_size=16, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    return kv_events.KVEventBatch(ts=1_700_000_000.0 + i, events=[block])


def read_back(bootstrap_servers: str, topic_prefix: str) -> list[Any]:
    """Every envelope in the test's topics so far."""
    records = read_envelopes(bootstrap_servers, topic_prefix=topic_prefix, idle_timeout_s=1)
    return [r.envelope for r in records]


def test_four_dp_ranks_each_get_their_bridge(bootstrap_servers: str, topic_prefix: str) -> None:
    """Like a DP=4 engine: one constructor call per rank on one configured port pair
    (vLLM offsets the ports by rank: 4 consecutive ports each, from a free one)."""
    config = PublisherConfig(
        bootstrap_servers=bootstrap_servers, topic_prefix=topic_prefix, instance="pod-s:8000"
    )
    construct = sidecar_constructor(kv_events.ZmqEventPublisher, config)
    pub_base = free_port()
    replay_base = pub_base + len(RANKS)
    publishers: dict[int, Any] = {}
    try:
        for rank in RANKS:
            publishers[rank] = construct(
                data_parallel_rank=rank,
                endpoint=f"tcp://*:{pub_base}",
                replay_endpoint=f"tcp://*:{replay_base}",
                buffer_steps=100,
            )
        for rank, publisher in publishers.items():
            assert isinstance(publisher, KvscopeSidecarPublisher)
            assert publisher.publish == publisher._inner.publish, "vLLM's publish, untouched"
            command = publisher.supervisor.command
            assert f"--zmq=tcp://127.0.0.1:{pub_base + rank}" in command
            assert f"--replay=tcp://127.0.0.1:{replay_base + rank}" in command
            assert f"--dp-rank={rank}" in command
            for i in range(6):  # some before the child subscribed: it replays them
                publisher.publish(stored(rank, i))
        wait_for(lambda: len(read_back(bootstrap_servers, topic_prefix)) >= 24, 120, "all in Kafka")
    finally:
        children = [p.supervisor.pid for p in publishers.values()]
        for publisher in publishers.values():
            publisher.shutdown()
    assert not any(pid and is_running(pid) for pid in children)

    envelopes = read_back(bootstrap_servers, topic_prefix)
    assert not [e for e in envelopes if isinstance(e.body, Gap)]
    for rank in RANKS:
        mine = [e for e in envelopes if e.source.dp_rank == rank]
        assert {(e.source.instance, e.source.engine) for e in mine} == {("pod-s:8000", "vllm")}
        hashes = [
            e.body.events[0].block_hashes[0]
            for e in sorted(mine, key=lambda e: e.seq)
            if isinstance(e.body, KVEventBatch)
        ]
        assert hashes == [1000 * rank + i for i in range(6)], "each batch exactly once"


def read_until_all(process: subprocess.Popen[str], needles: set[str]) -> None:
    """Read the process's output until every needle has appeared in some line."""
    assert process.stdout is not None
    missing, tail = set(needles), []
    for line in process.stdout:
        missing -= {n for n in missing if n in line}
        if not missing:
            return
        tail = [*tail[-60:], line]
    raise AssertionError(f"process ended before printing {missing}:\n{''.join(tail)}")


def test_engine_in_sidecar_mode_stores_exactly_what_vllm_published(
    tiny_llama: Path,
    tmp_path: Path,
    bootstrap_servers: str,
    topic_prefix: str,
    clickhouse: Any,
    clickhouse_url: str,
) -> None:
    pub_url, replay_url = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    go = tmp_path / "go"
    env = plugin_env(bootstrap_servers, topic_prefix, "pod-a:8000", kv_events_sidecar="1")
    engine = start_engine_proc([str(tiny_llama), pub_url, str(go), f"replay={replay_url}"], env)
    capture = None
    try:
        # The child logs into the engine's output: it has subscribed before the workload.
        read_until_all(engine, {"ready", f"bridge subscribed to {pub_url} (replay {replay_url})"})
        capture = ZmqCapture(pub_url)
        time.sleep(0.3)  # the capture's subscription reaches the PUB socket
        go.touch()
        truth = json.loads(read_until(engine, "truth ").split(" ", 1)[1])
        assert engine.stdout is not None
        rest = engine.stdout.read()  # EOF: the engine and its bridge child (same pipe) ended
        assert engine.wait(timeout=60) == 0
    finally:
        stop(capture, engine)
    assert re.search(rf"bridge stopped: {re.escape(pub_url)} forwarded [1-9]\d* lost 0", rest), rest

    collect(clickhouse, clickhouse_url, bootstrap_servers, topic_prefix)
    assert_same_blocks_as_zmq(clickhouse, capture)
    assert clickhouse.query("SELECT count() FROM stream_gaps").result_rows == [(0,)]
    source = ("pod-a:8000", str(tiny_llama), 0, "vllm")
    assert distinct(clickhouse, "kv_block_events", "instance, model, dp_rank, engine") == [source]
    assert len(truth["requests"]) == 8

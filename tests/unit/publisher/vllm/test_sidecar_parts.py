"""The sidecar's pure parts: which URL the bridge child connects to, and its command line.

The command is parsed by the real `kvscope` argument parser, so a flag the bridge does not
know fails here; the DP offset is compared with vLLM's own in tests/vllm/test_sidecar_engine.py.
"""

from __future__ import annotations

import pytest
from kvscope.cli.main import build_parser
from kvscope.common.kafka import KafkaSecurity
from kvscope.publisher.config import PublisherConfig
from kvscope.publisher.vllm.sidecar import bridge_command, check_bindable, dp_endpoint, local_url
from kvscope.schemas import ConfigError, Source

PORTS = (5557, 0, 65000)
RANKS = (0, 1, 2, 3)


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("host", ["*", "0.0.0.0", "[::]"])
def test_bind_all_hosts_become_loopback(host: str, port: int) -> None:
    assert local_url(f"tcp://{host}:{port}") == f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("host", ["10.0.0.5", "node-3.example", "127.0.0.1", "[fe80::1]"])
def test_concrete_hosts_and_ipc_stay(host: str, port: int) -> None:
    assert local_url(f"tcp://{host}:{port}") == f"tcp://{host}:{port}"
    assert local_url(f"ipc:///tmp/kv-{port}") == f"ipc:///tmp/kv-{port}"


def test_inproc_cannot_be_reached_from_the_child() -> None:
    with pytest.raises(ConfigError, match="in-process only"):
        local_url("inproc://cache")


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("host", ["*", "0.0.0.0", "10.0.0.5"])
def test_dp_rank_offsets_tcp_ports_like_vllm(host: str, rank: int) -> None:
    assert dp_endpoint(f"tcp://{host}:5557", rank) == f"tcp://{host}:{5557 + rank}"
    assert dp_endpoint(f"tcp://{host}:0", rank) == f"tcp://{host}:0"
    assert local_url(dp_endpoint("tcp://*:5557", rank)) == f"tcp://127.0.0.1:{5557 + rank}"


@pytest.mark.parametrize("rank", RANKS)
def test_dp_rank_of_ipc_and_inproc(rank: int) -> None:
    suffix = f"_dp{rank}" if rank else ""
    assert dp_endpoint("inproc://cache", rank) == f"inproc://cache{suffix}"
    if rank == 0:
        assert dp_endpoint("ipc:///tmp/kv", rank) == "ipc:///tmp/kv"
    else:
        with pytest.raises(ConfigError, match="tcp or inproc"):
            dp_endpoint("ipc:///tmp/kv", rank)


@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "tcp://[::]:5557", "ipc:///tmp/kv"])
def test_bound_endpoints_are_accepted(endpoint: str) -> None:
    check_bindable(endpoint)


@pytest.mark.parametrize(
    "endpoint", ["tcp://0.0.0.0:5557", "tcp://10.0.0.5:5557", "tcp://localhost:5557", "inproc://x"]
)
def test_endpoints_vllm_connects_to_are_refused(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="bind"):
        check_bindable(endpoint)


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("replay", [None, "tcp://127.0.0.1:5600"])
@pytest.mark.parametrize(("instance", "model"), [("pod-a:8000", "llama"), ("-odd name", "")])
def test_command_carries_the_tees_source_and_no_secret(
    rank: int, replay: str | None, instance: str, model: str
) -> None:
    config = PublisherConfig(
        bootstrap_servers="k1:9092,k2:9092",
        topic_prefix="team.",
        forward_token_ids=rank % 2 == 1,
        security=KafkaSecurity(
            security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="s3cret"
        ),
    )
    source = Source(
        instance=instance, model=model, role="decode", dp_rank=rank, engine="vllm",
        engine_version="0.32.0",
    )  # fmt: skip
    endpoint = f"tcp://127.0.0.1:{5557 + rank}"
    command = bridge_command(config, source, endpoint, replay, "/state", python="py")
    assert command[:4] == ["py", "-m", "kvscope.cli", "bridge"]
    assert not any("s3cret" in part or "sasl" in part for part in command)

    args = build_parser().parse_args(command[3:])
    assert (args.engine, args.zmq, args.replay, args.dp_rank) == (
        "vllm", [endpoint], [replay] if replay else [], [rank],
    )  # fmt: skip
    assert (args.instance, args.model, args.role, args.engine_version) == (
        instance, model, "decode", "0.32.0",
    )  # fmt: skip
    assert (args.bootstrap_servers, args.topic_prefix, args.state_dir) == (
        "k1:9092,k2:9092", "team.", "/state",
    )  # fmt: skip
    assert args.forward_token_ids is (rank % 2 == 1)

"""Pieces of the vLLM plugin that need no engine: KV events, connector stats, source naming."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import msgspec
from kvscope.publisher import PublisherConfig
from kvscope.publisher.vllm.convert import (
    backend_name,
    kv_batch_from_vllm,
    transfers_from_connector_stats,
)
from kvscope.publisher.vllm.source import default_instance, served_model_name, vllm_source
from kvscope.schemas import BlockRemoved, BlockStored
from prometheus_client import REGISTRY

STORED_FIELDS: list[tuple[str, Any]] = [
    ("block_hashes", list[int | bytes]),
    ("parent_block_hash", int | bytes | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
]
"""vLLM 0.32's in-memory BlockStored fields (before its defaulted ones)."""


def vllm_event(tag: str, fields: list[tuple[str, Any]], *without: str) -> Any:
    """A struct like vLLM's in-memory event `tag` of a release that lacks `without`."""
    kept = [field for field in fields if field[0] not in without]
    return msgspec.defstruct(f"{tag}Without{len(without)}", kept, tag=tag)


StoredBeforeLoraName = vllm_event("BlockStored", STORED_FIELDS, "lora_name")  # vllm#27577
StoredWithoutLoraId = vllm_event("BlockStored", STORED_FIELDS, "lora_id")  # deprecated
RemovedBeforeMedium = vllm_event("BlockRemoved", STORED_FIELDS[:1])


def test_kv_events_of_other_vllm_releases_convert() -> None:
    """The plugin converts vLLM's own objects; a field a release lacks reads as None."""
    digest = b"\x02" * 32
    events = [
        StoredBeforeLoraName([digest], None, [1] * 16, 16, 3, "GPU"),
        RemovedBeforeMedium([digest]),
        StoredWithoutLoraId([7], None, [2] * 16, 16, "CPU", "adapter"),
    ]
    batch = kv_batch_from_vllm(SimpleNamespace(ts=2.0, events=events, data_parallel_rank=1))
    old, removed, new = batch.events
    assert isinstance(old, BlockStored) and isinstance(new, BlockStored)
    assert (old.block_hashes, old.lora_id, old.lora_name) == ([0x0202020202020202], 3, None)
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium, removed.medium_raw) == (
        old.block_hashes,
        "GPU",
        None,
    )
    assert (new.lora_id, new.lora_name, new.medium) == (None, "adapter", "CPU")


def test_events_of_an_unknown_type_are_counted_and_skipped() -> None:
    transferred = vllm_event("BlockTransferred", STORED_FIELDS[:1])
    before = REGISTRY.get_sample_value("kvscope_publisher_unknown_events_total") or 0.0
    events = [transferred([1]), RemovedBeforeMedium([5]), transferred([2])]
    batch = kv_batch_from_vllm(SimpleNamespace(ts=3.0, events=events, data_parallel_rank=0))
    assert [e.block_hashes for e in batch.events] == [[5]]  # type: ignore[union-attr]
    assert REGISTRY.get_sample_value("kvscope_publisher_unknown_events_total") == before + 2


def test_a_batch_without_data_parallel_rank_converts() -> None:
    """vLLM's first KV-event releases: `EventBatch` is only `ts, events`."""
    batch = kv_batch_from_vllm(SimpleNamespace(ts=3.0, events=[RemovedBeforeMedium([5])]))
    assert (batch.ts, batch.dp_rank, batch.events[0].block_hashes) == (3.0, None, [5])


NIXL_PAYLOAD = {
    "transfer_duration": [0.004, 0.010],
    "post_duration": [0.001, 0.001],
    "bytes_transferred": [4096, 8192],
    "num_descriptors": [2, 4],
    "num_failed_transfers": [1],
    "num_failed_notifications": [],
}
"""Shape of `NixlKVConnectorStats.to_dict()` as it reaches `SchedulerStats.kv_connector_stats`."""


def test_nixl_stats_become_one_transfer_each_plus_failures() -> None:
    records = list(
        transfers_from_connector_stats(NIXL_PAYLOAD, "nixl", "decode-1:8000", "decode", now=50.0)
    )
    ok = [r for r in records if r.status == "ok"]
    assert [(r.latency_s, r.bytes, r.blocks, r.chunks) for r in ok] == [
        (0.004, 4096, 2, 1),
        (0.010, 8192, 4, 1),
    ]
    assert {(r.src_instance, r.dst_instance, r.backend) for r in records} == {
        ("", "decode-1:8000", "nixl")
    }
    assert ok[1].start_ts == 50.0 - 0.010
    assert [r.status for r in records if r.status != "ok"] == ["failed"]


def test_multi_connector_payloads_are_unnested_with_their_backend() -> None:
    payload = {"NixlConnector": NIXL_PAYLOAD, "MooncakeConnector": {"transfer_duration": [0.5]}}
    records = list(transfers_from_connector_stats(payload, "", "p-0", "prefill", now=1.0))
    assert sorted({(r.backend, r.src_instance, r.dst_instance) for r in records}) == [
        ("mooncake", "p-0", ""),
        ("nixl", "p-0", ""),
    ]
    assert len(records) == 4


def test_unknown_connector_payloads_give_nothing() -> None:
    assert list(transfers_from_connector_stats({"hits": 3}, "x", "i", "both")) == []


def test_backend_names() -> None:
    assert backend_name("NixlConnector") == "nixl"
    assert backend_name("MooncakeConnector") == "mooncake"
    assert backend_name("Connector") == "connector"


def test_default_instance_is_host_and_serve_port() -> None:
    host = socket.gethostname()
    assert default_instance(["vllm", "serve", "m", "--port", "9001"]) == f"{host}:9001"
    assert default_instance(["vllm", "serve", "m", "--port=9002"]) == f"{host}:9002"
    assert default_instance(["vllm", "serve", "m"]) == f"{host}:8000"
    assert default_instance(["python", "offline.py"]) == host


def test_source_prefers_kvscope_settings_over_what_vllm_knows() -> None:
    class ModelConfig:
        served_model_name = ("first", "second")

    class VllmConfig:
        model_config = ModelConfig()

    assert served_model_name(VllmConfig()) == "first"
    assert served_model_name(object()) == ""
    config = PublisherConfig(instance="pod-3", role="decode", model="")
    source = vllm_source(config, dp_rank=2, model="served")
    assert (source.instance, source.model, source.role, source.dp_rank) == (
        "pod-3",
        "served",
        "decode",
        2,
    )
    assert vllm_source(PublisherConfig(model="pinned"), 0, "served").model == "pinned"

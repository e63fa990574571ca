"""The forms a score request can take (ints, a uint64 array, little-endian u64 bytes) and the
table's reading of them: every form gets the answer a plain computation gives."""

from __future__ import annotations

import array
import random

import msgspec
import numpy as np
import pytest
from kvscope.index.state import PrefixIndex
from kvscope.index.table import STORE, BlockTable
from kvscope.schemas import Envelope, Source
from kvscope.schemas.wire import BlockStored, KVEventBatch

WIDTHS = [0, 1, 7, 8, 16, 17, 32, 33, 63, 64]
"""Bits of the hashes drawn: every msgpack int width (fixint, u8, u16, u32, u64), either side
of each boundary, 2**63 and up included."""


def _hashes(rng: random.Random, n: int) -> list[int]:
    """`n` distinct hashes of every width."""
    drawn: dict[int, None] = {}
    while len(drawn) < n:
        drawn[rng.getrandbits(rng.choice(WIDTHS))] = None
    return list(drawn)


def _forms(request: list[int]) -> dict[str, object]:
    """The same request in every form `PrefixIndex.score` takes."""
    packed = np.array(request, dtype=np.uint64)
    return {
        "list": request,
        "tuple": tuple(request),
        "uint64 array": packed,
        "strided uint64 array": np.repeat(packed, 2)[::2],
        "big-endian uint64 array": packed.astype(">u8"),
        "little-endian bytes": packed.astype("<u8").tobytes(),
        "numpy ints": [np.uint64(h) for h in request],  # msgspec refuses these: the slow path
        "array": array.array("Q", request),
    }


def _record(instance: str, gpu: list[int], cpu: list[int]) -> Envelope:
    events = [
        BlockStored(block_hashes=gpu, block_size=16, medium="GPU"),
        BlockStored(block_hashes=cpu, block_size=16, medium="CPU"),
    ]
    return Envelope(
        source=Source(instance=instance, model="m"),
        epoch=1,
        seq=0,
        ts=100.0,
        body=KVEventBatch(ts=0, events=events),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("n_sources", [1, 130])
@pytest.mark.parametrize("length", [0, 1, 100, 10_000])
@pytest.mark.parametrize("miss", ["none", "first", "middle", "last"])
def test_every_form_of_a_request_gets_the_plain_answer(
    n_sources: int, length: int, miss: str
) -> None:
    """Sources hold leading runs of a chain (some in a CPU tier); the request is the chain
    with one block no source holds at the first, middle or last place (or none): per
    source its leading run and weights, whatever form the request comes in."""
    rng = random.Random(f"{n_sources}/{length}/{miss}")
    chain = _hashes(rng, length)
    index = PrefixIndex({"GPU": 1.0, "CPU": 0.5})
    held: dict[str, tuple[int, int]] = {}
    for s in range(n_sources):
        run = rng.randint(0, length)
        on_cpu = rng.randint(0, run)  # the run's first blocks are in the CPU tier
        index.apply(_record(f"s{s}", chain[on_cpu:run], chain[:on_cpu]))
        held[f"s{s}"] = (run, on_cpu)
    request = list(chain)
    at = {"none": length, "first": 0, "middle": length // 2, "last": max(0, length - 1)}[miss]
    if at < length:
        request[at] = 2**64 - 1 - at
        assert request[at] not in chain
    expected = {}
    for instance, (run, on_cpu) in held.items():
        cut = min(run, at)
        expected[instance] = (cut, min(cut, on_cpu) * 0.5 + max(0, cut - on_cpu) * 1.0)
    for form, given in _forms(request).items():
        result = index.score(given)  # type: ignore[arg-type]
        got = {s.instance: (s.matched_blocks, s.score) for s in result.sources}
        assert got == expected, form
        scores = [s.score for s in result.sources]
        assert scores == sorted(scores, reverse=True), form


def test_routed_hints_extend_the_scores_of_every_form() -> None:
    """Hints are kept as Python ints: an array or bytes request finds them all the same."""
    index = PrefixIndex()
    index.apply(_record("a", [1, 2**63], []))
    assert index.add_routed([1, 2**63, 2**64 - 1, 5], "a")
    for form, given in _forms([1, 2**63, 2**64 - 1, 5, 6]).items():
        (only,) = index.score(given).sources  # type: ignore[arg-type]
        assert (only.matched_blocks, only.speculative_blocks) == (4, 2), form


@pytest.mark.parametrize("length", [15, 16, 65_535, 65_536])
def test_msgpack_array_headers_of_every_size_are_read(length: int) -> None:
    """fixarray, array 16 and array 32 headers either side of their limits."""
    table = BlockTable()
    hashes = np.arange(1, length + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    table.apply((hashes, np.zeros(length, np.int32), np.full(length, STORE, np.int8)))
    slot_source = np.zeros(1, np.int64)
    weights = np.ones(1)
    source_slots = np.zeros((1, 1), np.int64)
    request = msgspec.msgpack.encode(hashes.tolist())
    assert table.score(request, slot_source, weights, source_slots) == ([0], [length], [length])


@pytest.mark.parametrize(
    ("request_bytes", "raw"),
    [
        (b"", False),
        (b"\xc0", False),  # nil, not an array
        (b"\xdc\x00", False),  # a cut header
        (b"\x92\x01", False),  # two items promised, one given
        (b"\x91\xcf\x00\x01", False),  # a cut u64
        (b"\x91\x01\x02", False),  # a byte past the array
        (b"\x91\xff", False),  # -1
        (b"\x91\xd3" + bytes(8), False),  # an int64
        (b"\x91\xc3", False),  # true
        (b"\x91\xcb" + bytes(8), False),  # a float
        (bytes(7), True),
        (bytes(17), True),
    ],
)
def test_malformed_requests_are_refused(request_bytes: bytes, raw: bool) -> None:
    table = BlockTable()
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="score request"):
        table.score(request_bytes, one, np.ones(1), one.reshape(1, 1), raw=raw)


def test_hashes_outside_u64_are_refused_in_every_form() -> None:
    index = PrefixIndex()
    index.apply(_record("a", [1], []))
    with pytest.raises(ValueError):
        index.score([1, -1])
    with pytest.raises(OverflowError):
        index.score([1, 2**64])
    with pytest.raises(TypeError, match="uint64"):
        index.score(np.array([1, 2], dtype=np.int64))
    assert index.score(np.array([1, 2], dtype=np.uint32)).sources[0].matched_blocks == 1
    with pytest.raises(ValueError):
        index.score(bytes(9))
    assert index.score(bytes(0)).sources[0].matched_blocks == 0

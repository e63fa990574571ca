"""Block-hash arrays straight from their msgpack bytes, many events at a time.

The fast decode keeps each KV event's `block_hashes` as `msgspec.Raw` (the bytes of the
msgpack array) instead of one Python int per hash and a list per event. `parse` turns the
raw arrays of a whole batch into one uint64 numpy array with numpy: random 64-bit hashes
are encoded as msgpack uint64 (0xcf and 8 big-endian bytes) all but once in 2**32, so an
array of n of them is its header and 9n bytes of which every 9th is 0xcf, and the values
are a strided big-endian view. Any other array (small ints, non-minimal encodings) is
decoded by msgspec on its own, which also names whatever is wrong: not an array, a value
that is not an unsigned 64-bit int, more elements than the caller's limit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
import numpy as np
from kvscope.schemas.wire import UInt64
from msgspec import Meta

EMPTY = msgspec.Raw(b"\x90")
"""An empty msgpack array: the `block_hashes` of an event that has none."""
UINT64 = 0xCF
"""The msgpack marker of a uint64 (8 big-endian bytes follow)."""
_HEADERS = {0xDC: 2, 0xDD: 4}
"""array16 and array32 markers: bytes of the element count that follow them."""


@dataclasses.dataclass
class Hashes:
    """The hashes of a sequence of raw arrays, concatenated in order."""

    values: np.ndarray
    """uint64, array after array (an array in `errors` contributes nothing)."""
    counts: np.ndarray
    """int64, elements of each array (0 for one in `errors`)."""
    errors: dict[int, str]
    """Index of each array msgspec rejects -> its error (path relative to the array, `$`)."""

    def select(self, keep: np.ndarray) -> Hashes:
        """The hashes of the arrays where the bool array `keep` is True."""
        return Hashes(self.values[np.repeat(keep, self.counts)], self.counts[keep], {})


@dataclasses.dataclass
class Checked:
    """The block hashes of KV envelopes, all their events' arrays parsed at once."""

    envelopes: list[Any]
    """`FlatKVEnvelope`s (`kvscope.collector.pipeline.decode`)."""
    hashes: Hashes
    """Of every event of `envelopes`, in order."""
    events: np.ndarray
    """Events of each envelope."""
    problems: dict[int, str]
    """Index in `envelopes` -> msgspec's reason for its first bad array, as if the array
    had been decoded with the rest of the envelope (the path starts at the envelope)."""

    def of(self, envelopes: list[Any]) -> Hashes:
        """The hashes of `envelopes`, a subsequence of `self.envelopes` (the same objects)."""
        if len(envelopes) == len(self.envelopes):
            return self.hashes
        kept = {id(e) for e in envelopes}
        keep = np.fromiter((id(e) in kept for e in self.envelopes), bool, len(self.envelopes))
        return self.hashes.select(np.repeat(keep, self.events))


def check(envelopes: list[Any], max_length: int) -> Checked:
    """Parse the block hashes of every event of `envelopes` (at most `max_length` each)."""
    events = np.fromiter((len(e.body.events) for e in envelopes), np.int64, len(envelopes))
    parsed = parse([ev.block_hashes for e in envelopes for ev in e.body.events], max_length)
    problems: dict[int, str] = {}
    ends = np.cumsum(events)
    for event, error in sorted(parsed.errors.items()):
        j = int(np.searchsorted(ends, event, "right"))
        path = f"$.body.events[{event - ends[j] + events[j]}].block_hashes"
        at = error.replace("`$", f"`{path}", 1) if " - at `$" in error else f"{error} - at `{path}`"
        problems.setdefault(j, at)
    return Checked(envelopes, parsed, events, problems)


def count(raw: msgspec.Raw) -> int:
    """Elements of the msgpack array `raw` (0 when it is not an array)."""
    data = memoryview(raw)
    first = data[0] if len(data) else 0
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    size = _HEADERS.get(first)
    return int.from_bytes(data[1 : 1 + size], "big") if size else 0


@functools.cache
def _decoder(max_length: int) -> msgspec.msgpack.Decoder:
    """msgspec's decoder of a hash array of at most `max_length` elements."""
    return msgspec.msgpack.Decoder(Annotated[list[UInt64], Meta(max_length=max_length)])


def _headers(buf: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element count and header length of each raw array starting at `starts` in `buf`.

    Header length 0 marks a value that is not an array. `buf` must have 4 bytes of padding
    after its last value, so that a short last value is read past without an IndexError.
    """
    first = buf[starts]
    counts = (first & 0x0F).astype(np.int64)
    header = ((first & 0xF0) == 0x90).astype(np.int64)
    for marker, size in _HEADERS.items():
        at = np.flatnonzero(first == marker)
        if len(at):
            value = np.zeros(len(at), np.int64)
            for i in range(1, size + 1):
                value = (value << 8) | buf[starts[at] + i]
            counts[at] = value
            header[at] = 1 + size
    return counts, header


def _uint64s(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, header: np.ndarray, fast: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The elements of the `fast` arrays read as uint64s, and whether each was marked one.

    The arrays' bytes without their headers are 9-byte elements: a marker, then 8 bytes
    that a strided big-endian view reads in one pass.
    """
    keep = np.ones(len(buf), bool)
    keep[ends[-1] if len(ends) else 0 :] = False
    for extra in range(int(header.max(initial=1))):
        keep[starts[header > extra] + extra] = False
    for e in np.flatnonzero(~fast):
        keep[starts[e] : ends[e]] = False
    elements = buf[keep]
    if not len(elements):
        return np.empty(0, np.uint64), np.empty(0, bool)
    values = np.ndarray((len(elements) // 9,), ">u8", elements, 1, (9,))
    return values.astype(np.uint64), elements[::9] == UINT64


def parse(raws: Sequence[msgspec.Raw], max_length: int) -> Hashes:
    """All hashes of `raws` (each the bytes of one msgpack value), each array checked to be
    what msgspec decodes as a list of at most `max_length` unsigned 64-bit ints."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), np.int64, n)
    buf = np.frombuffer(b"".join([*raws, b"\0" * 4]), np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    counts, header = _headers(buf, starts)
    fast = (header > 0) & (lengths == header + 9 * counts) & (counts <= max_length)
    values, marked = _uint64s(buf, starts, ends, header, fast)
    if not marked.all():
        fast[np.repeat(np.flatnonzero(fast), counts[fast])[~marked]] = False
        values, _ = _uint64s(buf, starts, ends, header, fast)
    if fast.all():
        return Hashes(values, counts, {})
    errors: dict[int, str] = {}
    slow: dict[int, list[int]] = {}
    for e in np.flatnonzero(~fast).tolist():
        try:
            slow[e] = _decoder(max_length).decode(raws[e])
        except msgspec.ValidationError as exc:
            errors[e] = str(exc)
            slow[e] = []
    counts[list(slow)] = [len(v) for v in slow.values()]
    out = np.empty(int(counts.sum()), np.uint64)
    out[np.repeat(fast, counts)] = values
    offsets = np.cumsum(counts) - counts
    for e, hashes in slow.items():
        out[offsets[e] : offsets[e] + len(hashes)] = hashes
    return Hashes(out, counts, errors)

"""The resident-block table: which slots (source x tier) hold each block hash, compactly.

One open-addressing table (linear probing, backward-shift deletion) maps a block hash to
the id of an interned *slot set*: a bitmask over slots, stored once however many hashes
share it (the singletons {slot} and {gpu, cpu} pairs of one source cover most hashes). A
bucket costs 12 bytes (8 for the hash, 4 for the set id); the table keeps its load between
3/8 and 3/4, so a resident (hash, slot) entry costs at most 32 bytes and far less where
sources share prefixes. A second, small table counts the extra copies of a (hash, slot)
pair (vLLM can hold two copies of a hash): removing one copy keeps the other. Each set
counts the buckets naming it; a set no bucket names is freed at once and its id reused.

Dropping slots (a source cleared, restarted or forgotten) never walks the buckets on the
spot: it rewrites the interned sets' bitmasks (their number follows the distinct slot
combinations, not the resident hashes), so every answer is exact at once and the slot
numbers are free again. A bucket whose set lost all its bits is a *zombie*: it still
holds its hash and its place in probe runs (a tombstone), but no slot holds it. `sweep`
deletes zombies in bounded steps of buckets between other work; a regrow skips them.

The hot loops (applying a batch of stores and removals, sweeping, scoring a prefix) are
numba-compiled kernels over these arrays; `BlockTable` owns the arrays and grows them
before each batch, so a kernel never runs out of room. Kernels are compiled on first use
and cached on disk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from kvscope.index.jit import njit, trailing_zeros

STORE = 1
"""Op kind: one more copy of (hash, slot)."""
REMOVE = -1
"""Op kind: one copy fewer of (hash, slot) (nothing when it holds none)."""

_SETS, _FREE, _INDEXED, _ZOMBIES = 0, 1, 2, 3
"""Fields of a table's `meta` array: set ids handed out (the empty set 0 included), freed
ids waiting for reuse, entries in the set index (stale ones included), zombie buckets."""
SWEEP_BUCKETS = 1 << 17
"""Buckets one `sweep` step looks at (about a millisecond of work: 4.8 ms for 512k buckets,
a quarter of them zombies, measured on this 2-core machine under load)."""
_MAX_LOAD_NUM, _MAX_LOAD_DEN = 3, 4
_MIN_CAPACITY = 1 << 10
_U64 = np.uint64
Ops = tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32], npt.NDArray[np.int8]]
_BUCKET = np.dtype([("key", _U64), ("set", np.uint32)])
"""A bucket: the hash and its set id side by side, 12 bytes (unaligned, which x86 loads as
fast), so a lookup loads one cache line, not one in a keys and one in a sets array: at 16M
entries that took a 100-block score's loads from 3.5 to 2.3 µs."""


def _empty_buckets(
    capacity: int,
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.uint64], npt.NDArray[np.uint32]]:
    """`capacity` empty buckets, and their keys and set ids (two strided views of them)."""
    buckets = np.zeros(capacity, dtype=_BUCKET)
    return buckets, buckets["key"], buckets["set"]


@njit(cache=True, inline="always")
def _mix(key):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """splitmix64's finalizer: spreads engine hashes that are not uniform (SGLang ints)."""
    x = key
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _find(keys, sets, key):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Bucket of `key`, or -1-(the empty bucket where it would go)."""
    mask = np.uint64(keys.shape[0] - 1)
    i = np.int64(_mix(key) & mask)
    while True:
        if sets[i] == 0:
            return -1 - i
        if keys[i] == key:
            return i
        i = (i + 1) & np.int64(mask)


@njit(cache=True)
def _delete(keys, sets, i):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Empty bucket `i`, shifting later members of its probe run back (no tombstones)."""
    mask = np.int64(keys.shape[0] - 1)
    j = i
    while True:
        sets[i] = 0
        while True:
            j = (j + 1) & mask
            if sets[j] == 0:
                return
            home = np.int64(_mix(keys[j]) & np.uint64(mask))
            # keep j where it is when its home lies cyclically in (i, j]
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            break
        keys[i] = keys[j]
        sets[i] = sets[j]
        i = j


@njit(cache=True)
def _mask_hash(masks, row):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    h = np.uint64(0x9E3779B97F4A7C15)
    for w in range(masks.shape[1]):
        h = _mix(h ^ masks[row, w])
    return h


@njit(cache=True)
def _is_empty(masks, sid):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Whether set `sid`'s bitmask has no bit (the empty set, a freed id, a zombie's set)."""
    empty = True
    for w in range(masks.shape[1]):
        if masks[sid, w] != 0:
            empty = False
            break
    return empty


@njit(cache=True)
def _intern(masks, set_index, meta, free, scratch):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Id of the set whose bits are in masks[scratch] (a freed id, else a new one, when
    unseen). The index may name ids whose mask changed since: masks are compared, not ids."""
    width = masks.shape[1]
    if _is_empty(masks, scratch):
        return 0
    cap = np.int64(set_index.shape[0] - 1)
    i = np.int64(_mask_hash(masks, scratch) & np.uint64(cap))
    while True:
        sid = set_index[i]
        if sid == 0:
            break
        same = True
        for w in range(width):
            if masks[sid, w] != masks[scratch, w]:
                same = False
                break
        if same:
            return sid
        i = (i + 1) & cap
    if meta[_FREE] > 0:
        meta[_FREE] -= 1
        sid = free[meta[_FREE]]
    else:
        sid = meta[_SETS]
        meta[_SETS] += 1
    for w in range(width):
        masks[sid, w] = masks[scratch, w]
    set_index[i] = sid
    meta[_INDEXED] += 1
    return sid


@njit(cache=True)
def _release(masks, refs, free, meta, sid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """One bucket fewer names set `sid`; with none left its id is freed (its mask zeroed, so
    no lookup finds it any more) for the next new set."""
    refs[sid] -= 1
    if refs[sid] == 0:
        for w in range(masks.shape[1]):
            masks[sid, w] = 0
        free[meta[_FREE]] = sid
        meta[_FREE] += 1


@njit(cache=True)
def _with_bit(masks, set_index, meta, free, sid, slot, on):  # type: ignore[no-untyped-def]  # pragma: no cover
    scratch = masks.shape[0] - 1
    for w in range(masks.shape[1]):
        masks[scratch, w] = masks[sid, w] if sid != 0 else np.uint64(0)
    bit = np.uint64(1) << np.uint64(slot & 63)
    if on:
        masks[scratch, slot >> 6] |= bit
    else:
        masks[scratch, slot >> 6] &= ~bit
    return _intern(masks, set_index, meta, free, scratch)


@njit(cache=True)
def _has_bit(masks, sid, slot):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    if sid == 0:
        return False
    return (masks[sid, slot >> 6] >> np.uint64(slot & 63)) & np.uint64(1) == np.uint64(1)


@njit(cache=True)
def _copies_find(ekeys, eslots, key, slot):  # type: ignore[no-untyped-def]  # pragma: no cover
    mask = np.int64(ekeys.shape[0] - 1)
    i = np.int64((_mix(key) ^ np.uint64(slot)) & np.uint64(mask))
    while True:
        if eslots[i] < 0:
            return -1 - i
        if ekeys[i] == key and eslots[i] == slot:
            return i
        i = (i + 1) & mask


@njit(cache=True)
def _copies_delete(ekeys, eslots, ecounts, i):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Backward-shift deletion in the extra-copies table (as `_delete`)."""
    mask = np.int64(ekeys.shape[0] - 1)
    j = i
    while True:
        eslots[i] = -1
        while True:
            j = (j + 1) & mask
            if eslots[j] < 0:
                return
            home = np.int64((_mix(ekeys[j]) ^ np.uint64(eslots[j])) & np.uint64(mask))
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            break
        ekeys[i] = ekeys[j]
        eslots[i] = eslots[j]
        ecounts[i] = ecounts[j]
        i = j


@njit(cache=True)
def _apply(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    keys,
    sets,
    masks,
    set_index,
    meta,
    free,
    refs,
    ekeys,
    eslots,
    ecounts,
    counts,
    hashes,
    slots,
    kinds,
):
    """Apply ops in order; counts = [occupied buckets, extra copies, *per-slot residents]."""
    for n in range(hashes.shape[0]):
        key = hashes[n]
        slot = np.int64(slots[n])
        at = _find(keys, sets, key)
        sid = sets[at] if at >= 0 else 0
        held = _has_bit(masks, sid, slot)
        if kinds[n] > 0:
            if held:  # one more copy of a hash the slot holds
                e = _copies_find(ekeys, eslots, key, slot)
                if e < 0:
                    e = -1 - e
                    ekeys[e] = key
                    eslots[e] = slot
                    ecounts[e] = 0
                ecounts[e] += 1
                counts[1] += 1
                continue
            new = _with_bit(masks, set_index, meta, free, sid, slot, True)
            refs[new] += 1
            if at < 0:
                at = -1 - at
                keys[at] = key
                counts[0] += 1
            else:
                if _is_empty(masks, sid):  # a zombie holds the hash again
                    meta[_ZOMBIES] -= 1
                _release(masks, refs, free, meta, sid)
            sets[at] = new
            counts[2 + slot] += 1
        elif held:
            e = _copies_find(ekeys, eslots, key, slot)
            if e >= 0:  # drop an extra copy; the slot still holds the hash
                ecounts[e] -= 1
                counts[1] -= 1
                if ecounts[e] == 0:
                    _copies_delete(ekeys, eslots, ecounts, e)
                continue
            new = _with_bit(masks, set_index, meta, free, sid, slot, False)
            counts[2 + slot] -= 1
            if new == 0:
                _delete(keys, sets, at)
                counts[0] -= 1
            else:
                refs[new] += 1
                sets[at] = new
            _release(masks, refs, free, meta, sid)


@njit(cache=True)
def _remap(masks, refs, n_sets, new_slot, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each named set of `masks` with slot i's bit moved to `new_slot[i]` (dropped where -1),
    into `out`; returns the buckets whose set lost its last bit (the new zombies)."""
    zombies = 0
    for row in range(1, n_sets):
        if refs[row] == 0:
            continue
        had = False
        kept = False
        for w in range(masks.shape[1]):
            bits = masks[row, w]
            while bits != np.uint64(0):
                had = True
                slot = new_slot[w * 64 + np.int64(trailing_zeros(bits))]
                bits &= bits - np.uint64(1)
                if slot >= 0:
                    kept = True
                    out[row, slot >> 6] |= np.uint64(1) << np.uint64(slot & 63)
        if had and not kept:
            zombies += refs[row]
    return zombies


@njit(cache=True)
def _sweep(keys, sets, masks, refs, free, meta, counts, dead, start, budget):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Delete the zombies (buckets whose set is `dead`) among `budget` buckets from `start`
    (a deletion shifts a later bucket into the one looked at, which is looked at again);
    returns where to go on, the table's size once no zombie is left."""
    size = keys.shape[0]
    i = start
    seen = 0
    while i < size and seen < budget:
        seen += 1
        sid = sets[i]
        if dead[sid]:
            _delete(keys, sets, i)
            counts[0] -= 1
            meta[_ZOMBIES] -= 1
            _release(masks, refs, free, meta, sid)
            if meta[_ZOMBIES] == 0:
                return size
            continue
        i += 1
    return i


@njit(cache=True)
def _rehash(keys, sets, masks, refs, free, meta, counts, new_keys, new_sets):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Every bucket into the new arrays, but zombies, which are deleted on the way."""
    for i in range(keys.shape[0]):
        sid = sets[i]
        if sid == 0:
            continue
        if _is_empty(masks, sid):
            counts[0] -= 1
            meta[_ZOMBIES] -= 1
            _release(masks, refs, free, meta, sid)
            continue
        at = -1 - _find(new_keys, new_sets, keys[i])
        new_keys[at] = keys[i]
        new_sets[at] = sid


@njit(cache=True, inline="always")
def _big_endian(data, at, size):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The unsigned int in data[at:at + size], most significant byte first (msgpack's order)."""
    value = np.uint64(0)
    for j in range(size):
        value = (value << np.uint64(8)) | np.uint64(data[at + j])
    return value


@njit(cache=True, inline="always")
def _count(data, size):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """A msgpack array's length: the `size` bytes after its tag, most significant first."""
    count = 0
    for j in range(1, 1 + size):
        count = (count << 8) | int(data[j])
    return count


@njit(cache=True)
def _unpack(request, raw):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The hashes of a request and whether it was well formed: `raw`, little-endian u64s
    back to back; else a msgpack array of unsigned ints (how msgspec encodes a list of
    ints: the cheapest way from Python ints to bytes, about half of `array("Q", ...)`)."""
    size = len(request)
    if raw:
        n = size // 8
        out = np.empty(n, dtype=np.uint64)
        for i in range(n):
            value = np.uint64(0)
            for j in range(8 * i + 7, 8 * i - 1, -1):
                value = (value << np.uint64(8)) | np.uint64(request[j])
            out[i] = value
        return out, size % 8 == 0
    head = int(request[0]) if size else 0
    if 0x90 <= head <= 0x9F:
        n, at = head & 0x0F, 1
    elif head == 0xDC and size >= 3:
        n, at = _count(request, 2), 3
    elif head == 0xDD and size >= 5:
        n, at = _count(request, 4), 5
    else:
        return np.empty(0, dtype=np.uint64), False
    out = np.empty(min(n, size), dtype=np.uint64)  # an item takes a byte at least
    for i in range(n):
        if at >= size:
            return out, False
        tag = int(request[at])
        if tag < 0x80:  # a positive fixint
            out[i] = tag
            at += 1
            continue
        if tag < 0xCC or tag > 0xCF:  # not an unsigned int (negatives, bools, ...)
            return out, False
        width = 1 << (tag - 0xCC)
        if at + 1 + width > size:
            return out, False
        out[i] = _big_endian(request, at + 1, width)
        at += 1 + width
    return out, at == size


@njit(cache=True)
def _touch(keys, sets, hashes):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Load every hash's home bucket first: the loads are independent, so the CPU overlaps
    their cache and TLB misses instead of waiting for each in turn while probing."""
    mask = np.uint64(keys.shape[0] - 1)
    acc = np.uint64(0)
    for n in range(hashes.shape[0]):
        i = _mix(hashes[n]) & mask
        acc ^= keys[i] ^ np.uint64(sets[i])
    return acc


@njit(cache=True)
def _score(  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    buckets, masks, request, raw, slot_source, slot_weight, source_slots, found, score
):
    """Sources holding the request's first block (numbers into found[0, :k]) and, for each,
    the leading blocks held in any of its slots (found[1, :k]) and their summed best
    weights (score[0, :k]); returns k (-1 for a request `_unpack` refuses) and the first
    source's three values (boxing them is cheaper than reading them from Python). Per
    block the work is the bits of sources still matching, so a block held by the whole
    fleet costs the whole fleet only while the whole fleet still matches. Allocates only
    the unpacked hashes: found[2] (each source's place, -1 when unseen: left so on
    return) and found[3], score[1] and the masks' scratch row are its working space."""
    hashes, ok = _unpack(request, raw)
    if not ok:
        return -1, 0, 0, 0.0
    if hashes.shape[0] == 0 or source_slots.shape[0] == 0:
        return 0, 0, 0, 0.0
    keys = buckets["key"]
    sets = buckets["set"]
    if _find(keys, sets, hashes[0]) < 0:  # nothing to touch for: no source matches
        return 0, 0, 0, 0.0
    touched = _touch(keys, sets, hashes)  # first: what follows runs while the loads land
    width = masks.shape[1]
    live = masks[masks.shape[0] - 1]  # the scratch row: free outside an apply
    live[:] = 0
    for own in range(slot_source.shape[0]):
        if slot_source[own] >= 0:
            live[own >> 6] |= np.uint64(1) << np.uint64(own & 63)
    hit = found[0]
    matched = found[1]
    where = found[2]
    active = found[3]
    best = score[1]
    total = score[0]
    if touched == np.uint64(0x9E3779B97F4A7C15):
        where[0] = -2  # any negative is "not seen": this only keeps the loads from being elided
    n_hit = 0
    n_active = 0
    for n in range(hashes.shape[0]):
        at = _find(keys, sets, hashes[n])
        if at < 0:
            break
        sid = sets[at]
        for w in range(width):
            bits = masks[sid, w] & live[w]
            while bits != np.uint64(0):
                slot = w * 64 + np.int64(trailing_zeros(bits))
                bits &= bits - np.uint64(1)
                src = slot_source[slot]
                k = where[src]
                if k < 0:  # first block: every source holding it matches so far
                    k = n_hit
                    n_hit += 1
                    where[src] = k
                    hit[k] = src
                    matched[k] = 0
                    total[k] = 0.0
                    active[n_active] = k
                    n_active += 1
                    best[k] = -1.0
                if slot_weight[slot] > best[k]:
                    best[k] = slot_weight[slot]
        if n == 0:  # from here on only the slots of the sources that matched count
            live[:] = 0
            for a in range(n_active):
                for own in source_slots[hit[active[a]]]:
                    if own >= 0:
                        live[own >> 6] |= np.uint64(1) << np.uint64(own & 63)
        kept = 0
        for a in range(n_active):
            k = active[a]
            if best[k] >= 0.0:
                matched[k] += 1
                total[k] += best[k]
                best[k] = -1.0
                active[kept] = k
                kept += 1
            else:  # the run ends here: its slots stop counting
                for own in source_slots[hit[k]]:
                    if own >= 0:
                        live[own >> 6] &= ~(np.uint64(1) << np.uint64(own & 63))
        n_active = kept
        if n_active == 0:
            break
    for k in range(n_hit):
        where[hit[k]] = -1
    if n_hit == 0:
        return 0, 0, 0, 0.0
    return n_hit, hit[0], matched[0], total[0]


@njit(cache=True)
def _list(keys, sets, masks, wanted, start, limit, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Hashes from bucket `start` on whose set meets `wanted`; returns (found, next bucket)."""
    found = 0
    i = start
    width = masks.shape[1]
    while i < keys.shape[0] and found < limit:
        sid = sets[i]
        if sid != 0:
            for w in range(width):
                if masks[sid, w] & wanted[w] != np.uint64(0):
                    out[found] = keys[i]
                    found += 1
                    break
        i += 1
    return found, i


class BlockTable:
    """Resident (hash, slot) entries with copy counts; slots are small ints chosen by the caller.

    Not thread-safe: one owner applies, drops, sweeps and scores (the index's event loop).
    """

    def __init__(self, capacity: int = _MIN_CAPACITY, max_slots: int = 64) -> None:
        capacity = max(_MIN_CAPACITY, 1 << (max(capacity, 1) - 1).bit_length())
        self._bucket_array, self._keys, self._sets = _empty_buckets(capacity)
        self._width = max(1, -(-max_slots // 64))
        self._masks = np.zeros((1024, self._width), dtype=_U64)  # row 0: the empty set
        self._refs = np.zeros(1024, dtype=np.int64)
        """Per set id: the buckets naming it."""
        self._free = np.zeros(1024, dtype=np.int64)
        """Freed set ids (a stack, `meta[_FREE]` deep)."""
        self._set_index = np.zeros(2048, dtype=np.int64)
        self._meta = np.array([1, 0, 0, 0], dtype=np.int64)
        self._ekeys = np.zeros(256, dtype=_U64)
        self._eslots = np.full(256, -1, dtype=np.int64)
        self._ecounts = np.zeros(256, dtype=np.int64)
        self._counts = np.zeros(2 + 64 * self._width, dtype=np.int64)
        self._found = np.empty((4, 0), np.int64)
        """Buffer `score` answers in: source numbers, matched blocks (and `_weights`); its
        rows 2 and 3 are the kernel's working space (row 2 all -1 between calls)."""
        self._weights = np.empty((2, 0))
        self._cursor = 0
        """Where the next `sweep` step starts."""
        self.generation = 0
        """Bumped whenever buckets move (growth, a dropped slot): listing cursors expire."""

    @property
    def max_slots(self) -> int:
        """Slots the set masks can hold now (they widen on demand)."""
        return 64 * self._width

    @property
    def hashes(self) -> int:
        """Distinct resident hashes (zombies not counted)."""
        return int(self._counts[0] - self._meta[_ZOMBIES])

    @property
    def zombies(self) -> int:
        """Buckets holding a hash no slot holds any more, left for `sweep`."""
        return int(self._meta[_ZOMBIES])

    @property
    def sets_in_use(self) -> int:
        """Interned slot sets some bucket names (the empty set not counted)."""
        return int(self._meta[_SETS] - 1 - self._meta[_FREE])

    @property
    def extra_copies(self) -> int:
        """Copies beyond the first of a (hash, slot) pair."""
        return int(self._counts[1])

    @property
    def entries(self) -> int:
        """Resident (hash, slot) pairs: a block held in two tiers or sources counts twice."""
        return int(self._counts[2:].sum())

    def resident(self, slot: int) -> int:
        """Distinct hashes `slot` holds."""
        return int(self._counts[2 + slot]) if slot < self.max_slots else 0

    def nbytes(self) -> int:
        """Bytes held by the arrays (the table's memory, all but a few hundred bytes)."""
        arrays = (self._keys, self._sets, self._masks, self._set_index, self._ekeys)
        sets = self._refs.nbytes + self._free.nbytes
        return sum(a.nbytes for a in arrays) + self._eslots.nbytes + self._ecounts.nbytes + sets

    def ensure_slot(self, slot: int) -> None:
        """Widen the set masks so that `slot` fits."""
        if slot < self.max_slots:
            return
        width = slot // 64 + 1
        masks = np.zeros((self._masks.shape[0], width), dtype=_U64)
        masks[:, : self._width] = self._masks
        counts = np.zeros(2 + 64 * width, dtype=np.int64)
        counts[: self._counts.shape[0]] = self._counts
        self._masks, self._counts, self._width = masks, counts, width
        self._reindex_sets(self._set_index.shape[0])

    def apply(self, ops: Ops) -> None:
        """Apply (hashes, slots, kinds) in order: STORE adds a copy, REMOVE drops one."""
        hashes, slots, kinds = ops
        n = int(hashes.shape[0])
        if not n:
            return
        self._reserve(n)
        _apply(
            self._keys,
            self._sets,
            self._masks,
            self._set_index,
            self._meta,
            self._free,
            self._refs,
            self._ekeys,
            self._eslots,
            self._ecounts,
            self._counts,
            hashes,
            slots,
            kinds,
        )

    def drop_slots(self, slots: Sequence[int]) -> None:
        """Forget everything `slots` hold (their sources cleared their caches or restarted);
        the slots stay usable. Costs the interned sets, not the buckets (see `remap_slots`)."""
        new_slot = np.arange(self.max_slots, dtype=np.int64)
        dropped = [slot for slot in slots if slot < self.max_slots and self._counts[2 + slot]]
        if dropped:
            new_slot[dropped] = -1
            self.remap_slots(new_slot, self._width)

    def remap_slots(self, new_slot: npt.NDArray[np.int64], width: int | None = None) -> None:
        """Renumber the slots (slot i becomes `new_slot[i]`; -1 drops what it holds) in every
        interned set and in the copy counts, and narrow the masks to `width` words (by
        default the words the new numbers need), so memory and score time follow the live
        slots. Answers are exact at once and every number not in `new_slot` is free; the
        buckets left holding no slot are zombies until `sweep` (or a regrow) deletes them.
        Costs the sets' masks and the copies table, never a pass over the buckets."""
        old_width = self._width
        mapping = np.full(64 * old_width, -1, dtype=np.int64)
        mapping[: min(len(new_slot), len(mapping))] = new_slot[: len(mapping)]
        if width is None:
            width = max(1, -(-(int(mapping.max(initial=-1)) + 1) // 64))
        masks = np.zeros((self._masks.shape[0], width), dtype=_U64)
        n_sets = int(self._meta[_SETS])
        self._meta[_ZOMBIES] += _remap(self._masks, self._refs, n_sets, mapping, masks)
        old = np.flatnonzero(mapping >= 0)
        counts = np.zeros(2 + 64 * width, dtype=np.int64)
        counts[:2] = self._counts[:2]
        counts[2 + mapping[old]] = self._counts[2 + old]
        if self._counts[1]:  # extra copies follow their slots; dropped slots' go
            held = self._eslots >= 0
            eslots = np.full_like(self._eslots, -1)
            eslots[held] = mapping[self._eslots[held]]
            counts[1] -= int(self._ecounts[held & (eslots < 0)].sum())
            self._eslots = eslots
        self._masks, self._counts, self._width = masks, counts, width
        # copies hash by slot, so they move; both tables sized for what is left
        self._regrow_copies(max(256, 1 << (self.extra_copies * 2).bit_length()))
        self._reindex_sets(max(2048, 1 << ((self.sets_in_use + 1) * 2).bit_length()))
        self.generation += 1

    @property
    def sweeping(self) -> bool:
        """Whether zombies are left for `sweep`."""
        return bool(self._meta[_ZOMBIES])

    def sweep(self, buckets: int | None = None) -> bool:
        """Delete the zombies among the next `buckets` buckets (default `SWEEP_BUCKETS`);
        True while zombies are left.
        A pass that ends with some left (a deletion of the feed's can shift one into the
        part already swept) starts over; once none is left, a table under 3/8 full shrinks
        (one rehash of what is left: memory follows the live entries)."""
        if not self._meta[_ZOMBIES]:
            return False
        size = self._keys.shape[0]
        budget = SWEEP_BUCKETS if buckets is None else buckets
        n_sets = int(self._meta[_SETS])  # ids above were never handed out
        dead = np.zeros(n_sets, dtype=np.bool_)  # no bucket names the empty set nor a freed id
        dead[1:] = ~self._masks[1:n_sets].any(axis=1)
        self._cursor = int(_sweep(*self._buckets(), dead, self._cursor, budget))
        if self._cursor >= size:
            self._cursor = 0
        if self._meta[_ZOMBIES]:
            return True
        self.generation += 1
        capacity = size
        while capacity > _MIN_CAPACITY and self.hashes * 8 <= capacity * 3:
            capacity //= 2  # a load of 3/8 to 3/4 again
        if capacity < size:
            self._regrow(capacity)
        return False

    def score(
        self,
        request: bytes,
        slot_source: npt.NDArray[np.int64],
        slot_weight: npt.NDArray[np.float64],
        source_slots: npt.NDArray[np.int64],
        *,
        raw: bool = False,
    ) -> tuple[list[int], list[int], list[float]]:
        """The sources (numbers, as `slot_source` names them) holding the request's first
        block, and per such source the leading hashes held in any of its slots (its row of
        `source_slots`, padded with -1) and their best weights' sum. Sources not listed hold
        none: the answer's size follows the sources that match, not the fleet.

        `request` is a msgpack array of unsigned 64-bit ints (`msgspec.msgpack.encode` of
        a list of hashes), or with `raw` the hashes as little-endian u64s; ValueError for
        anything else."""
        n_sources = source_slots.shape[0]
        if self._found.shape[1] < n_sources:
            size = max(64, 1 << n_sources.bit_length())
            self._found, self._weights = np.full((4, size), -1, np.int64), np.empty((2, size))
        found, weights = self._found, self._weights
        k, number, blocks, weight = _score(
            self._bucket_array,
            self._masks,
            request,
            raw,
            slot_source,
            slot_weight,
            source_slots,
            found,
            weights,
        )
        if k <= 0:
            if k < 0:
                form = "little-endian u64s" if raw else "a msgpack array of unsigned ints"
                raise ValueError(f"a score request is {form}: block hashes in 0..2**64-1")
            return [], [], []
        if k == 1:  # the common case: one source holds the prefix
            return [number], [blocks], [weight]
        numbers, matched = found[:2, :k].tolist()
        return numbers, matched, weights[0, :k].tolist()

    def list_hashes(self, slots: list[int], start: int, limit: int) -> tuple[list[int], int]:
        """Up to `limit` hashes held by any of `slots`, from bucket `start`; and where to go on
        (the table's size when done)."""
        wanted = np.zeros(self._width, dtype=_U64)
        for slot in slots:
            if slot < self.max_slots:
                wanted[slot >> 6] |= _U64(1) << _U64(slot & 63)
        out = np.zeros(max(limit, 1), dtype=_U64)
        found, end = _list(self._keys, self._sets, self._masks, wanted, start, limit, out)
        return [int(h) for h in out[:found]], int(end)

    @property
    def size(self) -> int:
        """Buckets in the table (the end of a listing)."""
        return int(self._keys.shape[0])

    def _reserve(self, n: int) -> None:
        self._reserve_sets(n)
        needed = int(self._counts[0]) + n  # zombies take buckets until deleted
        if needed * _MAX_LOAD_DEN > self._keys.shape[0] * _MAX_LOAD_NUM:
            capacity = self._keys.shape[0]
            needed -= self.zombies  # the regrow deletes them
            while needed * _MAX_LOAD_DEN > capacity * _MAX_LOAD_NUM:
                capacity *= 2
            self._regrow(capacity)
        needed_copies = self.extra_copies + n
        if needed_copies * 2 > self._ekeys.shape[0]:
            capacity = self._ekeys.shape[0]
            while needed_copies * 2 > capacity:
                capacity *= 2
            self._regrow_copies(capacity)

    def _reserve_sets(self, n: int) -> None:
        """Room for `n` new sets (one op makes at most one) plus the scratch row, and for
        their entries in the set index (rebuilt without stale entries when full)."""
        needed = int(self._meta[_SETS]) + n + 1
        rows = self._masks.shape[0]
        if needed > rows:
            while needed > rows:
                rows *= 2
            masks = np.zeros((rows, self._width), dtype=_U64)
            masks[: self._masks.shape[0] - 1] = self._masks[:-1]
            self._masks = masks
            self._refs = np.concatenate((self._refs, np.zeros(rows - len(self._refs), np.int64)))
            self._free = np.concatenate((self._free, np.zeros(rows - len(self._free), np.int64)))
        if (int(self._meta[_INDEXED]) + n + 1) * 2 > self._set_index.shape[0]:
            live = self.sets_in_use + n + 1
            self._reindex_sets(max(2048, 1 << (live * 2).bit_length()))

    def _buckets(self) -> tuple[npt.NDArray[np.generic], ...]:
        """What the sweep and rehash kernels read and write, in their argument order."""
        return (
            self._keys,
            self._sets,
            self._masks,
            self._refs,
            self._free,
            self._meta,
            self._counts,
        )

    def _reindex_sets(self, capacity: int) -> None:
        self._set_index = np.zeros(capacity, dtype=np.int64)
        self._meta[_INDEXED] = _reindex(self._masks, self._set_index, int(self._meta[_SETS]))

    def _regrow(self, capacity: int) -> None:
        buckets, keys, sets = _empty_buckets(capacity)
        _rehash(*self._buckets(), keys, sets)
        self._bucket_array, self._keys, self._sets = buckets, keys, sets
        self._cursor = 0
        self.generation += 1

    def _regrow_copies(self, capacity: int) -> None:
        ekeys = np.zeros(capacity, dtype=_U64)
        eslots = np.full(capacity, -1, dtype=np.int64)
        ecounts = np.zeros(capacity, dtype=np.int64)
        if self._counts[1]:  # else there is nothing to move
            _rehash_copies(self._ekeys, self._eslots, self._ecounts, ekeys, eslots, ecounts)
        self._ekeys, self._eslots, self._ecounts = ekeys, eslots, ecounts


@njit(cache=True)
def _rehash_copies(ekeys, eslots, ecounts, nkeys, nslots, ncounts):  # type: ignore[no-untyped-def]  # pragma: no cover
    for i in range(ekeys.shape[0]):
        if eslots[i] >= 0:
            at = -1 - _copies_find(nkeys, nslots, ekeys[i], eslots[i])
            nkeys[at] = ekeys[i]
            nslots[at] = eslots[i]
            ncounts[at] = ecounts[i]


@njit(cache=True)
def _reindex(masks, set_index, n_sets):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Index every set with a bit (freed ids and zombies' sets have none); returns how many."""
    cap = np.int64(set_index.shape[0] - 1)
    indexed = 0
    for sid in range(1, n_sets):
        if _is_empty(masks, sid):
            continue
        i = np.int64(_mask_hash(masks, sid) & np.uint64(cap))
        while set_index[i] != 0:
            i = (i + 1) & cap
        set_index[i] = sid
        indexed += 1
    return indexed

"""A run's index entry: its key hashes, sorted, kept beside the run on the disk tier.

A point reader (`reader.PointReader`) sorts the key hashes of every run of a state into one
index. Built from the runs themselves, that meant reading every run whole, and, for an
append's run (a restore finds many: merges spend a budget and fall behind), decoding its keys,
hashing and sorting them: at 10^7 keys over two workers, 138 runs of 667 MB, 1.3 s of a
restore's critical path that grew with the state. The disk tier keeps, beside each run it can,
the run's sorted hashes and the permutation that sorts them (FORMAT.md, "Run index"): the
persister makes an append's off the processing thread and outside the tier lock, a merge's are
its own sections copied. A reader then reads 12 bytes an entry, and a run itself only when a
look-up lands in it.

An entry names the checksum of the run it indexes and has a checksum of its own: one that does
not match (a run written again at the same seq by a rollback, a damaged entry) is not used,
and the reader indexes that run from its bytes, as it does a run with no entry.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import xxhash

from lsm.codec import key_hashes, unpack_keys
from lsm.run import HASHED, HEADER, MULTI, SECTIONS

MAGIC = b"NSRI"
VERSION = 1
ENTRY = struct.Struct("<4sHHQQQ")
"""magic, version, reserved (0), n, the run's checksum, xxh3_64 of the body."""
HASH_SLICE = 4096
"""Keys hashed per C call (about 0.4 ms)."""
_U64 = np.dtype("<u8")
_U32 = np.dtype("<u4")


def _entry(checksum: int, hashes: bytes, order: bytes, n: int) -> bytes:
    body = hashes + order
    return ENTRY.pack(MAGIC, VERSION, 0, n, checksum, xxhash.xxh3_64_intdigest(body)) + body


def of_run(run: bytes, keys: Any = None, hash_keys: bool = True) -> bytes | None:
    """The index entry of the encoded run `run`, or None if it gets none: a merged run's is its
    hashes and order sections; an append's (its key column `keys` given, or decoded here) is
    its keys hashed and sorted (stable), if `hash_keys` and it has no pairs and no key twice
    (the reader takes such a run's latest versions from its bytes)."""
    f = HEADER.unpack_from(run, 0)
    flags, n, npairs, checksum, lengths = f[2], f[5], f[8], f[11], f[14:]
    if not n:
        return None
    at = dict(zip(SECTIONS, np.cumsum([HEADER.size, *lengths[:-1]]).tolist(), strict=True))
    if flags & HASHED:
        a, b = at["hashes"], at["order"]
        return _entry(checksum, run[a : a + 8 * n], run[b : b + 4 * n], n)
    if npairs or flags & MULTI or not hash_keys:
        return None
    if keys is None:
        a = at["keys"]
        keys = unpack_keys(memoryview(run)[a : a + lengths[SECTIONS.index("keys")]])
    got = sorted_hashes(keys)
    if got is None:
        return None
    order, h = got
    return _entry(checksum, h.tobytes(), order.astype(_U32).tobytes(), n)


def sorted_hashes(keys: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The permutation that sorts the key hashes of column `keys` (stable), and the hashes
    sorted by it; None if two are equal (a key twice, the later winning, or two keys of one
    hash: such a run is read from its latest versions)."""
    # in slices: each a C call holding the interpreter lock, which another thread gets between
    # two, not after the whole column
    h = np.empty(len(keys), _U64)
    for i in range(0, len(keys), HASH_SLICE):
        h[i : i + HASH_SLICE] = key_hashes(keys[i : i + HASH_SLICE])
    order = np.argsort(h, kind="stable")
    h = h[order]
    if bool(np.any(h[1:] == h[:-1])):
        return None
    return order, h


def read(entry: bytes | None, checksum: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The sorted hashes and their columns an index entry holds for a run of `n` entries whose
    checksum is `checksum`; None if there is no entry, or it is not that run's, or not whole."""
    if entry is None or len(entry) != ENTRY.size + 12 * n:
        return None
    magic, version, _, count, of, body_sum = ENTRY.unpack_from(entry, 0)
    if magic != MAGIC or version != VERSION or count != n or of != checksum:
        return None
    body = memoryview(entry)[ENTRY.size :]
    if xxhash.xxh3_64_intdigest(body) != body_sum:
        return None
    hashes = np.frombuffer(body[: 8 * n], dtype=_U64)
    if not hashes.flags.aligned:
        hashes = hashes.copy()
    return hashes, np.frombuffer(body[8 * n :], dtype=_U32)

"""Runs: one state's updates of one or more seqs, encoded in bulk as columns.

A run is the store's unit of state. `append` turns each state's changed keys into a
`PendingRun` (the key column as given, the value column packed by one msgpack call, the
positions of deletions); the persister encodes it (`PendingRun.encode`): a sorted key-hash
column (`codec.key_hashes`, C calls only) with the permutation that sorts it, and the key
column packed by one call. No Python runs per key on either side.

A merge (`merge`) folds consecutive runs of one state into one multi-version run: its *latest*
block holds the newest version of every key (what `load` applies), its *history* block the
older versions that some read at or after the retention horizon can still see (what an as-of
read inside the run's seq range needs). FORMAT.md defines the bytes.

A merged run's latest key and value columns are in blocks of BLOCK entries, each a msgpack
array of its own, with the start of every block in a section of their own.

`RunView` reads an encoded run without copying it: the fixed-width columns are numpy views of
the bytes, the msgpack columns are decoded on first use. `lookup` is a binary search of the hash
column, then one block of each column decoded; `apply` is `dict.update(zip(keys, values))`, a
block at a time in a merged run, and one `pop` per deletion.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from operator import eq, itemgetter
from typing import Any

import msgpack
import numpy as np
import xxhash

from lsm.codec import (
    TOMBSTONE,
    key_hashes,
    pack_blocks,
    pack_column,
    pack_keys,
    pack_values,
    unpack_column,
    unpack_keys,
    unpack_values,
)
from lsm.errors import CorruptLogError, FormatVersionError

RUN_MAGIC = b"NSRN"
RUN_VERSION = 4
MULTI = 1
"""Flag: the run holds a seq column and a history block (a merge wrote it)."""
HASHED = 2
"""Flag: the run holds the sorted key-hash column of its key column (a merge wrote it); an
append's run does not (only a point look-up needs the hashes: the persister makes them for the
run's index entry on the disk tier, `runindex`)."""
FULL = 4
"""Flag: the run holds every live key of its state as of its first seq (a key it lacks is
deleted there), and, merged, at every seq of its range: a read at or after its first seq
needs no older run of the state."""
TUPLES = 8
"""Flag: the values section is a tuple column (`codec.pack_column`): every array in it is a
tuple."""
H_TUPLES = 16
"""Flag: the h_values section is a tuple column."""
HEADER = struct.Struct("<4sHHQQIIIIQQQII12I")
SECTIONS = (
    "pairs",
    "hashes",
    "order",
    "blocks",
    "keys",
    "values",
    "dels",
    "seqs",
    "h_hashes",
    "h_keys",
    "h_values",
    "h_seqs",
)
ALL_HASHES = (0, (1 << 64) - 1)
MISSING = object()
_U64 = np.dtype("<u8")
_U32 = np.dtype("<u4")
APPLY_SLICE = 100_000
"""Pairs a run puts into a dict per `dict.update` (`Run.apply`)."""
BLOCK = 64
"""Entries per block of a merged run's latest key and value columns (FORMAT.md): a point
look-up decodes one block of each, about 6 us for 100-byte values, where a whole column of
millions of keys took seconds; a load decodes the blocks in turn, and its caller may do
other work between two (`RunView.apply_steps`)."""


def _bounds(sorted_hashes: np.ndarray) -> tuple[int, int]:
    if len(sorted_hashes) == 0:
        return 1, 0  # an empty range: no key hash falls in it
    return int(sorted_hashes[0]), int(sorted_hashes[-1])


CHECKSUM_AT = 56
"""Where the checksum lies in the header: it covers the header's other bytes and the body."""


def _checksum(head: bytes | memoryview, body: bytes | memoryview) -> int:
    h = xxhash.xxh3_64()
    h.update(head[:CHECKSUM_AT])
    h.update(head[CHECKSUM_AT + 8 : HEADER.size])
    h.update(body)
    return h.intdigest()


def _assemble(
    lo: int,
    hi: int,
    flags: int,
    n: int,
    ndel: int,
    nhist: int,
    hmin: int,
    hmax: int,
    sections: list[bytes],
    npairs: int = 0,
    block: int = 0,
) -> bytes:
    body = b"".join(sections)
    fields = [
        RUN_MAGIC,
        RUN_VERSION,
        flags,
        lo,
        hi,
        n,
        ndel,
        nhist,
        npairs,
        hmin,
        hmax,
        0,
        block,
        0,
        *(len(s) for s in sections),
    ]
    head = HEADER.pack(*fields)
    fields[11] = _checksum(head, body)
    return HEADER.pack(*fields) + body


def _is_map(chunk: bytes) -> bool:
    """Whether a msgpack chunk of pairs is a map (else an array of [key, value] pairs)."""
    first = chunk[0]
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def join_pairs(chunks: list[tuple[int, bytes]]) -> tuple[int, bytes]:
    """One msgpack map or array of the pairs in `chunks`, in order: (n, msgpack map of n
    entries, a later entry of a key the newer) or (n, msgpack array of n [key, value] pairs)
    each. Chunks of one kind have their headers cut and one header for all of them written, so
    the pairs are copied once and never decoded; chunks of both kinds are decoded and packed
    again as one map."""
    total = sum(n for n, _ in chunks)
    kinds = {_is_map(b) for n, b in chunks if n}
    if len(kinds) > 1:
        items = []
        for n, b in chunks:
            if n:
                got = unpack_keys(b)
                items.extend(got.items() if isinstance(got, dict) else got)
        return len(items), msgpack.Packer(use_bin_type=True).pack_map_pairs(items)
    p = msgpack.Packer()
    head = p.pack_map_header if kinds == {True} else p.pack_array_header
    return total, head(total) + b"".join(b[len(head(n)) :] for n, b in chunks if n)


class PendingRun:
    """A run as appended, before the persister encodes it (single seq).

    Its pairs (updates logged as they were made, oldest first: `Updates.pairs`) come before its
    columns, and within either a later entry holds the newer version of a key; `dels` lists
    the deletions that are a key's last column (a key deleted and then set again in one batch
    is set)."""

    __slots__ = (
        "seq",
        "_n",
        "_keys",
        "keys_b",
        "values_b",
        "dels",
        "pairs_b",
        "npairs",
        "_latest",
        "full",
        "tuples",
        "given",
    )
    hashed = False
    """Whether `lookup` needs the key's hash (an append's run is searched as a dict)."""

    def __init__(
        self,
        seq: int,
        n: int,
        keys_b: bytes,
        values_b: bytes,
        dels: list[int],
        pairs_b: bytes = b"",
        npairs: int = 0,
        full: bool = False,
        tuples: bool = False,
    ) -> None:
        self.seq = seq
        self.full = full
        """Whether the run holds every live key of its state (`FULL`)."""
        self.tuples = tuples
        """Whether `values_b` is a tuple column (`TUPLES`)."""
        self._n = n
        self._keys: tuple | None = None
        self.keys_b = keys_b
        self.values_b = values_b
        self.dels = dels
        self.pairs_b = pairs_b
        self.npairs = npairs
        self._latest: dict | None = None
        self.given: tuple | None = None
        """The key column as the caller gave it (immutable keys), until the persister has made
        the run's index entry from it (`runindex.of_run`): no decoding of `keys_b` for that."""

    @property
    def lo(self) -> int:
        """The run's first seq: its only one."""
        return self.seq

    @property
    def hi(self) -> int:
        """The run's last seq: its only one."""
        return self.seq

    @property
    def n(self) -> int:
        """Entries in the key and value columns (besides the pairs)."""
        return self._n

    @property
    def keys(self) -> tuple:
        """The key column, decoded from its bytes once (a read before the run is indexed):
        the run holds nothing of what the caller appended but bytes."""
        if self._keys is None:
            self._keys = unpack_keys(self.keys_b)
        return self._keys

    @property
    def nbytes(self) -> int:
        """The size of the encoded run."""
        return HEADER.size + len(self.pairs_b) + len(self.keys_b) + len(self.values_b) + 4 * len(self.dels)

    @property
    def values(self) -> list:
        """The value column, decoded anew: the caller owns what it gets."""
        return unpack_column(self.values_b, self.tuples)

    def pairs(self) -> dict | tuple:
        """The pairs, decoded anew: a dict of each key's last (a map), or the pairs in order."""
        return unpack_keys(self.pairs_b) if self.npairs else ()

    def lookup(self, key: Any, h: int, as_of: int) -> Any:
        """The value of `key` as of `as_of` in this run: a value, TOMBSTONE, or MISSING (`h` is
        unused: the run is searched as a dict built once)."""
        if as_of < self.seq:
            return MISSING
        v = self.latest().get(key, MISSING)
        return v if v is MISSING else own(v)

    def lookup_cost(self) -> int:
        """The bytes a look-up would decode first: none once the run's dict is built."""
        return 0 if self._latest is not None else len(self.pairs_b) + len(self.values_b)

    def latest(self) -> dict:
        """Each key's version in the run (a deletion as TOMBSTONE), as a dict built once. The
        values are the run's: a caller hands out `own` copies of them."""
        if self._latest is None:
            latest: dict = {}
            self.apply(latest, keep_deletions=True)
            self._latest = latest
        return self._latest

    def apply_steps(self, d: dict, as_of: int | None = None, keep_deletions: bool = False) -> Iterator[None]:
        """`apply`, as one part (a run of one append is small)."""
        self.apply(d, as_of, keep_deletions)
        yield

    def apply(self, d: dict, as_of: int | None = None, keep_deletions: bool = False) -> None:
        """Makes `d` the state after this run (REQUIRES: `as_of` None or at least its seq); with
        `keep_deletions`, a deleted key is left as TOMBSTONE."""
        if self.npairs:
            d.update(self.pairs())
        keys = self.keys
        d.update(zip(keys, self.values, strict=True))
        if not keep_deletions:
            pop = d.pop
            for i in self.dels:
                pop(keys[i], None)

    def entries(self) -> tuple[list, list, np.ndarray, np.ndarray]:
        """keys, values, seqs and hashes of each key's version in the run (its last entry;
        a deletion as TOMBSTONE), for a merge: the run's duplicates collapse here, at C speed."""
        latest: dict = {}
        self.apply(latest, keep_deletions=True)
        keys = list(latest)
        return keys, list(latest.values()), np.full(len(keys), self.seq, _U64), key_hashes(keys)

    def encode(self) -> bytes:
        """The run's bytes: the sections laid end to end, nothing decoded or hashed."""
        sections = [
            self.pairs_b,
            b"",
            b"",
            b"",
            self.keys_b,
            self.values_b,
            np.asarray(self.dels, dtype=_U32).tobytes(),
            b"",
            b"",
            b"",
            b"",
            b"",
        ]
        flags = (FULL if self.full else 0) | (TUPLES if self.tuples else 0)
        return _assemble(
            self.seq, self.seq, flags, self._n, len(self.dels), 0, *ALL_HASHES, sections, npairs=self.npairs
        )


class RunView:
    """An encoded run, read in place. `where` names it in errors (the store and the run)."""

    __slots__ = (
        "data",
        "where",
        "flags",
        "lo",
        "hi",
        "n",
        "ndel",
        "nhist",
        "npairs",
        "hmin",
        "hmax",
        "hashed",
        "full",
        "block",
        "_latest",
        "_off",
        "_keys",
        "_kofs",
        "_vofs",
        "_hkeys",
        "_hhashes",
        "_hvalues",
        "_hashes",
        "_order",
    )

    def __init__(self, data: bytes, where: str, verify: bool = True) -> None:
        if len(data) < HEADER.size:
            raise CorruptLogError(where, 0, f"run shorter than its header ({len(data)} bytes)")
        fields = HEADER.unpack_from(data, 0)
        magic, version, flags, lo, hi, n, ndel, nhist, npairs, hmin, hmax, checksum, block = fields[:13]
        lengths = fields[14:]
        if magic != RUN_MAGIC:
            raise CorruptLogError(where, 0, "not a run (bad magic)")
        if version != RUN_VERSION:
            raise FormatVersionError(where, version, RUN_VERSION)
        if HEADER.size + sum(lengths) != len(data):
            raise CorruptLogError(where, 0, "run length does not match its sections")
        if verify:
            mv = memoryview(data)
            if _checksum(mv[: HEADER.size], mv[HEADER.size :]) != checksum:
                raise CorruptLogError(where, HEADER.size, "run checksum mismatch")
        self.data = data
        self.where = where
        self.flags, self.lo, self.hi, self.n, self.ndel, self.nhist = flags, lo, hi, n, ndel, nhist
        self.npairs = npairs
        self.hmin, self.hmax = hmin, hmax
        self.hashed = bool(flags & HASHED)
        self.full = bool(flags & FULL)
        self.block = block
        self._latest: dict | None = None
        off = {}
        pos = HEADER.size
        for name, ln in zip(SECTIONS, lengths, strict=True):
            off[name] = (pos, pos + ln)
            pos += ln
        self._off = off
        self._keys = self._hkeys = self._hvalues = None
        self._hashes = self._order = self._kofs = self._vofs = self._hhashes = None
        if block:
            self._check_blocks(lengths[SECTIONS.index("keys")], lengths[SECTIONS.index("values")])
        elif lengths[SECTIONS.index("blocks")]:
            raise CorruptLogError(where, 0, "run has a blocks section but no block size")
        elif self.hashed and n:
            raise CorruptLogError(where, 0, f"a merged run of {n} keys has no block size")

    def _check_blocks(self, keys_len: int, values_len: int) -> None:
        """The blocks section is the starts of each block in the key column, then in the value
        column, each closed by its column's length, nowhere going back."""
        nb = -(-self.n // self.block)
        a, b = self._off["blocks"]
        if b - a != 16 * (nb + 1):
            raise CorruptLogError(self.where, a, f"blocks section of {b - a} bytes for {nb} blocks")
        both = np.frombuffer(self._raw("blocks"), dtype=_U64)
        kofs, vofs = both[: nb + 1], both[nb + 1 :]
        for ofs, total, name in ((kofs, keys_len, "key"), (vofs, values_len, "value")):
            if ofs[0] != 0 or ofs[-1] != total or bool(np.any(ofs[1:] < ofs[:-1])):
                raise CorruptLogError(self.where, a, f"the {name} column's block offsets do not cover it")
        self._kofs, self._vofs = kofs.tolist(), vofs.tolist()

    @property
    def nbytes(self) -> int:
        """The size of the encoded run."""
        return len(self.data)

    def _raw(self, name: str) -> memoryview:
        a, b = self._off[name]
        return memoryview(self.data)[a:b]

    def _u64(self, name: str) -> np.ndarray:
        return np.frombuffer(self._raw(name), dtype=_U64)

    def _searchable(self, name: str) -> np.ndarray:
        """A u64 section to binary-search: numpy copies an unaligned array whole at every
        `searchsorted` (a millisecond a look-up at 2M keys), so such a section is copied
        once, aligned."""
        a = self._u64(name)
        return a if a.flags.aligned else a.copy()

    @property
    def hashes(self) -> np.ndarray:
        """The sorted key-hash column of the latest block (empty in an append's run), a view of the
        bytes made once."""
        if self._hashes is None:
            self._hashes = self._searchable("hashes")
        return self._hashes

    @property
    def order(self) -> np.ndarray:
        """The permutation that sorts the hash column: the key column's index of each entry of
        `hashes`."""
        if self._order is None:
            self._order = np.frombuffer(self._raw("order"), dtype=_U32)
        return self._order

    @property
    def dels(self) -> np.ndarray:
        """The positions in the key column of the deleted keys (a view of the bytes)."""
        return np.frombuffer(self._raw("dels"), dtype=_U32)

    @property
    def seqs(self) -> np.ndarray:
        """The seq of each latest entry, in column order."""
        if self.flags & MULTI:
            return self._u64("seqs")
        return np.full(self.n, self.hi, _U64)

    @property
    def keys(self) -> tuple:
        """The key column of the latest block, decoded once."""
        if self._keys is None:
            if not self.n:
                self._keys = ()
            elif self.block:
                self._keys = tuple(itertools.chain.from_iterable(map(self._key_block, range(len(self._kofs) - 1))))
            else:
                self._keys = unpack_keys(self._raw("keys"))
        return self._keys

    @property
    def values(self) -> list:
        """The value column, decoded anew: the caller owns what it gets (nothing it changes
        can reach what the store reads later)."""
        if not self.n:
            return []
        if self.block:
            out: list = []
            for b in range(len(self._vofs) - 1):
                out += self._value_block(b)
            return out
        return unpack_column(self._raw("values"), bool(self.flags & TUPLES))

    def key_at(self, c: int) -> Any:
        """The key in column `c` of a merged run's latest block (one block decoded: every
        hashed run is blocked)."""
        return self._key_block(c // self.block)[c % self.block]

    def value_at(self, c: int) -> Any:
        """The value in column `c` of a merged run's latest block, decoded anew (the caller's)."""
        return self._value_block(c // self.block)[c % self.block]

    def _key_block(self, b: int) -> tuple:
        """The keys of block `b` of a blocked run, decoded anew."""
        a = self._off["keys"][0]
        return unpack_keys(memoryview(self.data)[a + self._kofs[b] : a + self._kofs[b + 1]])

    def _value_block(self, b: int) -> list:
        """The values of block `b` of a blocked run, decoded anew (the caller's to change)."""
        a = self._off["values"][0]
        raw = memoryview(self.data)[a + self._vofs[b] : a + self._vofs[b + 1]]
        return unpack_column(raw, bool(self.flags & TUPLES))

    @property
    def history(self) -> tuple[tuple, list, np.ndarray, np.ndarray]:
        """keys, values (decoded anew), seqs, hashes of the older versions, by hash then
        newest first."""
        if not self.nhist:
            return (), [], np.zeros(0, _U64), np.zeros(0, _U64)
        return self._history_keys(), self._history_values(), self._u64("h_seqs"), self._u64("h_hashes")

    def _history_values(self) -> list:
        """The history block's value column, decoded anew."""
        return unpack_column(self._raw("h_values"), bool(self.flags & H_TUPLES))

    def pairs(self) -> dict | tuple:
        """The pairs, decoded anew: a dict of each key's last (a map), or the pairs in order."""
        return unpack_keys(self._raw("pairs")) if self.npairs else ()

    def _history_keys(self) -> tuple:
        if self._hkeys is None:
            self._hkeys = unpack_keys(self._raw("h_keys"))
        return self._hkeys

    def lookup_cost(self) -> int:
        """The bytes a look-up would decode first: an append's run whole until its dict is
        built; a merged run's, one block of each column, counted as none (its history's are
        not counted: an as-of read that old is rare)."""
        return 0 if self.hashed or self._latest is not None else len(self.data)

    def latest(self) -> dict:
        """An append's run (not hashed): each key's version in it (a deletion as TOMBSTONE),
        as a dict built once. The values are the run's: a caller hands out `own` copies."""
        if self._latest is None:
            latest: dict = {}
            self.apply(latest, keep_deletions=True)
            self._latest = latest
        return self._latest

    def lookup(self, key: Any, h: int, as_of: int) -> Any:
        """The value of `key` as of `as_of` in this run: a value the caller owns, TOMBSTONE,
        or MISSING."""
        if as_of < self.lo:
            return MISSING
        if not self.flags & HASHED:
            # an append's run (one seq): its latest versions, as a dict built once
            v = self.latest().get(key, MISSING)
            return v if v is MISSING else own(v)
        if h < self.hmin or h > self.hmax:
            return MISSING
        hashes = self.hashes
        hu = np.uint64(h)  # a Python int above 2**63 would make numpy compare as floats, slowly
        i = int(hashes.searchsorted(hu))
        if i < self.n and hashes[i] == hu:
            j = i + 1
            while j < self.n and hashes[j] == hu:  # keys sharing a hash: rare
                j += 1
            found = -1
            for c in self.order[i:j].tolist():
                if self.key_at(c) == key and c > found:
                    found = c  # the last column of a key is its newest version in the run
            if found >= 0:
                seq = int(self._u64("seqs")[found]) if self.flags & MULTI else self.hi
                if seq <= as_of:
                    return self.value_at(found)
        if self.nhist and as_of < self.hi:
            if self._hhashes is None:
                self._hhashes = self._searchable("h_hashes")
            hkeys, hseqs, hhashes = self._history_keys(), self._u64("h_seqs"), self._hhashes
            i = int(np.searchsorted(hhashes, hu, "left"))
            j = int(np.searchsorted(hhashes, hu, "right"))
            for x in range(i, j):
                if hseqs[x] <= as_of and hkeys[x] == key:
                    if self._hvalues is None:
                        self._hvalues = self._history_values()
                    return own(self._hvalues[x])  # newest first: the first one old enough
        return MISSING

    def apply(self, d: dict, as_of: int | None = None, keep_deletions: bool = False) -> None:
        """Makes `d` the state after this run, as of `as_of` (None: the run's last seq); with
        `keep_deletions`, a deleted key is left as TOMBSTONE."""
        for _ in self.apply_steps(d, as_of, keep_deletions):
            pass

    def apply_steps(self, d: dict, as_of: int | None = None, keep_deletions: bool = False) -> Iterator[None]:
        """`apply`, a part at a time: yields after each block of a merged run (each
        APPLY_SLICE entries of another run), so that its caller can do other work between two
        parts; `d` is the state after the run once the iterator is done."""
        if as_of is None or as_of >= self.hi:
            if self.npairs:
                d.update(self.pairs())
            if self.block:
                yield from self._apply_blocks(d, keep_deletions)
                return
            keys = self.keys
            values = self.values
            if len(keys) != len(values):
                raise ValueError(f"a run of {len(keys)} keys has {len(values)} values")
            # in slices: one update of millions of pairs holds the GIL for over a second
            for i in range(0, len(keys), APPLY_SLICE):
                d.update(zip(keys[i : i + APPLY_SLICE], values[i : i + APPLY_SLICE], strict=True))
                yield
            if self.ndel and not keep_deletions:
                pop = d.pop
                for i in self.dels.tolist():
                    pop(keys[i], None)
            return
        if as_of < self.lo:
            return
        for k, v in self.as_of(as_of).items():
            if v is TOMBSTONE:
                d.pop(k, None)
            else:
                d[k] = v

    def _apply_blocks(self, d: dict, keep_deletions: bool) -> Iterator[None]:
        """`apply_steps` of a blocked run, a block at a time: nothing but one block's keys and
        values is decoded at once."""
        for b in range(len(self._kofs) - 1):
            keys, values = self._key_block(b), self._value_block(b)
            if len(keys) != len(values):
                raise CorruptLogError(self.where, 0, f"block {b} holds {len(keys)} keys and {len(values)} values")
            d.update(zip(keys, values, strict=True))
            yield
        if self.ndel and not keep_deletions:
            pop, block = d.pop, self.block
            for i in self.dels.tolist():
                pop(self._key_block(i // block)[i % block], None)

    def as_of(self, as_of: int) -> dict:
        """Every key's newest version at or below `as_of` in this run (TOMBSTONE included)."""
        out: dict = {}
        if not self.flags & MULTI:
            if as_of >= self.hi:
                self.apply(out, keep_deletions=True)
            return out
        hkeys, hvalues, hseqs, _ = self.history
        for k, v, s in zip(hkeys, hvalues, hseqs.tolist(), strict=True):
            if s <= as_of and k not in out:
                out[k] = v  # newest first within a key
        seqs = self.seqs.tolist()
        for k, v, s in zip(self.keys, self.values, seqs, strict=True):
            if s <= as_of:
                out[k] = v  # a latest entry is newer than any history entry of its key
        return out

    def entries(self) -> tuple[list, list, np.ndarray, np.ndarray]:
        """keys, values, seqs and hashes of every version in the run (latest, then history),
        for a merge; an append's run gives each key's last entry (its duplicates collapse at C
        speed) and is hashed here."""
        if not self.flags & MULTI:
            latest: dict = {}
            self.apply(latest, keep_deletions=True)
            keys = list(latest)
            values = list(latest.values())
            if self.flags & HASHED and not self.npairs and len(keys) == self.n:
                col_h = np.empty(self.n, _U64)
                col_h[self.order] = self.hashes
                by_key = dict(zip(self.keys, col_h.tolist(), strict=True))
                hashes = np.fromiter(map(by_key.__getitem__, keys), _U64, len(keys))
            else:
                hashes = key_hashes(keys)
            return keys, values, np.full(len(keys), self.hi, _U64), hashes
        hkeys, hvalues, hseqs, hhashes = self.history
        col_h = np.empty(self.n, _U64)
        col_h[self.order] = self.hashes
        keys = list(self.keys) + list(hkeys)
        values = list(self.values) + list(hvalues)
        return keys, values, np.concatenate([self.seqs, hseqs]), np.concatenate([col_h, hhashes])


def merge(runs: list, horizon: int, base: bool) -> bytes:
    """One run holding what the consecutive `runs` (oldest first) of one state hold.

    Its latest block is each key's newest version; its history block keeps an older version
    only while a read at or after `horizon` can see it (the next newer version of its key is
    above `horizon`). With `base` (no older run of the state exists), a deletion at or below
    `horizon` is dropped: nothing older is left for it to hide.
    """
    K: list = []
    V: list = []
    S_parts = []
    H_parts = []
    for r in runs:
        k, v, s, h = r.entries()
        K += k
        V += v
        S_parts.append(s)
        H_parts.append(h)
    full = runs[0].full
    S, H = np.concatenate(S_parts), np.concatenate(H_parts)
    return _build(K, V, S, H, runs[0].lo, runs[-1].hi, horizon, base or full, full)


def truncate(run: RunView | PendingRun, to_seq: int, horizon: int, base: bool) -> bytes:
    """The run without its versions above `to_seq` (a rollback into a merged run's range)."""
    K, V, S, H = run.entries()
    keep = np.flatnonzero(S <= to_seq).tolist()
    get = itemgetter(*keep) if len(keep) > 1 else (lambda seq: tuple(seq[i] for i in keep))
    full = run.full
    return _build(list(get(K)), list(get(V)), S[keep], H[keep], run.lo, to_seq, horizon, base or full, full)


def image(runs: list, seq: int, horizon: int | None = None) -> bytes:
    """One run holding the state after `seq` of the consecutive `runs` (oldest first) of one
    state, and nothing newer: every live key's value (a base image), and the older versions a
    read at or after `horizon` (default `seq`: none) can see."""
    horizon = seq if horizon is None else horizon
    # from the newest run at or below `seq` that holds every live key: the older ones are
    # not read through it (a key deleted there is absent from it, not marked)
    start = max((i for i, r in enumerate(runs) if r.full and r.lo <= seq), default=0)
    runs = runs[start:]
    parts = [r.entries() for r in runs]
    K = [k for p in parts for k in p[0]]
    V = [v for p in parts for v in p[1]]
    S = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, _U64)
    H = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, _U64)
    keep = np.flatnonzero(S <= seq).tolist()
    lo = runs[0].lo if runs else seq
    full = bool(runs) and runs[0].full
    return _build([K[i] for i in keep], [V[i] for i in keep], S[keep], H[keep], lo, seq, min(seq, horizon), True, full)


def _build(
    K: list, V: list, S: np.ndarray, H: np.ndarray, lo: int, hi: int, horizon: int, base: bool, full: bool = False
) -> bytes:
    flags = MULTI | HASHED | (FULL if full else 0)
    total = len(K)
    if total == 0:
        return _assemble(lo, hi, flags, 0, 0, 0, 1, 0, [b""] * len(SECTIONS))
    S = S.astype(np.int64)
    pos = np.arange(total, dtype=np.int64)
    # by hash, then newest first; among versions of one seq (a key twice in one batch) the later
    idx = np.lexsort((-pos, -S, H))
    Ka = np.fromiter(K, dtype=object, count=total)
    Hs, Ks = H[idx], Ka[idx]
    same_h = Hs[1:] == Hs[:-1]
    same_k = np.fromiter(map(eq, Ks[1:], Ks[:-1]), dtype=bool, count=total - 1)
    if bool(np.any(same_h & ~same_k)):
        # two keys share a hash: order them by their bytes inside the hash, so that each
        # key's versions lie together
        kb = list(map(pack_keys, K))
        idx = np.array(sorted(range(total), key=lambda x: (int(H[x]), kb[x], -int(S[x]), -x)), dtype=np.int64)
        Hs, Ks = H[idx], Ka[idx]
        same_h = Hs[1:] == Hs[:-1]
        same_k = np.fromiter(map(eq, Ks[1:], Ks[:-1]), dtype=bool, count=total - 1)
    Ss = S[idx]
    first = np.ones(total, dtype=bool)
    first[1:] = ~(same_h & same_k)
    Va = np.fromiter(V, dtype=object, count=total)
    deleted = np.fromiter(map(_is_tombstone, Va[idx]), dtype=bool, count=total)
    # an older version stays while its next newer version (the entry before it) is newer than
    # it and above the horizon
    keep_hist = np.zeros(total, dtype=bool)
    keep_hist[1:] = ~first[1:] & (Ss[:-1] > Ss[1:]) & (Ss[:-1] > horizon)
    keep_latest = first
    if base:
        keep_latest = first & ~(deleted & (Ss <= horizon))
    lat = idx[keep_latest]
    hist = idx[keep_hist]
    lat_keys, lat_values = Ka[lat].tolist(), Va[lat].tolist()
    hist_keys, hist_values = Ka[hist].tolist(), Va[hist].tolist()
    lat_h = H[lat]
    lat_dels = np.flatnonzero(deleted[keep_latest]).astype(_U32)
    hmin, hmax = _bounds(lat_h)
    key_blocks = [pack_keys(lat_keys[i : i + BLOCK]) for i in range(0, len(lat_keys), BLOCK)]
    value_blocks, lat_tuples = pack_blocks(lat_values, BLOCK)
    hist_b, _, hist_tuples = pack_column(hist_values)
    flags |= (TUPLES if lat_tuples else 0) | (H_TUPLES if hist_tuples else 0)
    starts = [np.cumsum([0, *map(len, parts)], dtype=np.int64) for parts in (key_blocks, value_blocks)]
    sections = [
        b"",
        lat_h.astype(_U64).tobytes(),
        np.arange(len(lat_keys), dtype=_U32).tobytes(),
        np.concatenate(starts).astype(_U64).tobytes(),
        b"".join(key_blocks),
        b"".join(value_blocks),
        lat_dels.tobytes(),
        S[lat].astype(_U64).tobytes(),
        H[hist].astype(_U64).tobytes(),
        pack_keys(hist_keys),
        hist_b,
        S[hist].astype(_U64).tobytes(),
    ]
    return _assemble(lo, hi, flags, len(lat_keys), len(lat_dels), len(hist_keys), hmin, hmax, sections, block=BLOCK)


def _is_tombstone(v: Any) -> bool:
    return v is TOMBSTONE


IMMUTABLE_TYPES = frozenset({int, float, str, bytes, bool, type(None)})


def own(v: Any) -> Any:
    """A value a caller may change: a container from a run's decoded column is copied (with the
    codec, which keeps its types), so that what the caller does to it reaches no later read."""
    return v if type(v) in IMMUTABLE_TYPES or v is TOMBSTONE else unpack_values(pack_values(v))

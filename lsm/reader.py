"""Point reads of one state as of one seq, through one index of every run's key hashes.

`Store.get` searches a state's runs newest first, each by a binary search of its own hash
column: a look-up costs a few microseconds per run it passes. A state written under a merge
budget has many runs (10^7 keys updated in turn, 2 x 25,000 updates/s, a 0.05 budget: 110 runs
of one worker's state, the keys of each in none of the others), so a key read alone cost
about 40 us, more than a record's whole processing.

A `PointReader` (`Store.reader`) takes the runs a read as of `at` needs, once, and sorts the
key hashes of all of them into one array of u64 entries: a hash's high bits, then where the
entry came from in the low bits (enough for the entries indexed). A run of the disk tier gives
its index entry (`runindex`: its hashes sorted, kept beside it), and is read only when a
look-up lands in it, or ahead by `prefetch`: at 10^7 keys over 2 workers, 138 runs of 667 MB,
the index took 1.3 s built from the runs themselves, 0.2 s from their entries. A run without an
entry (in memory, or with pairs or a key twice) gives what the entry would: a merged run's
column is sorted already; an append's has its keys decoded and hashed, and each run's hashes
are sorted alone first. One stable sort then merges the sorted parts, newest run first among
equal high bits; two keys whose hashes share them are told apart by the keys themselves. An
append's key and value columns are decoded at the first look-up that lands in its run. A
look-up is one binary search, then the key and its value decoded from one block of the merged
run that holds it (or taken from the append's decoded columns), whatever the number of runs.
The run whose seq range holds `at` (its history may hold the version as of `at`) is read by its
own look-up first; it is the newest the read needs, since runs of one state do not overlap.

The reader keeps the runs it indexed, or the LevelDB snapshot it reads them through: merges
meanwhile replace them on the disk tier, not in the reader, which stays a consistent view as of
`at` for as long as it lives.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from lsm.codec import TOMBSTONE, key_hash
from lsm.errors import KeyEncodingError
from lsm.keys import KEY_TYPES, decode_key, encode_key
from lsm.run import MISSING, MULTI, RunView, own
from lsm.runindex import sorted_hashes

_U64 = np.dtype("<u8")


def read_key(key: Any, where: str) -> Any:
    """`key` as the runs hold it (lists, at any depth, as tuples); KeyEncodingError naming the
    key and `where` (the store) for a key that `append` refuses."""
    if type(key) is str or type(key) in KEY_TYPES:
        return key
    try:
        return decode_key(encode_key(key))[0]
    except (TypeError, ValueError, OverflowError) as e:
        raise KeyEncodingError(f"key {key!r:.60} of {where}: {e}") from None


def read_hash(key: Any, where: str) -> int:
    """The key hash of `key` (`read_key`'s), refused as `append` refuses it (a str with a lone
    surrogate: no UTF-8 of it)."""
    try:
        if type(key) is str and not key.isascii():
            key.encode()
        return key_hash(key)
    except (TypeError, ValueError, OverflowError) as e:
        raise KeyEncodingError(f"key {key!r:.60} of {where}: {e}") from None


class _Part:
    """A run as the index's look-ups read it: by the column of the entry they land on, its key
    (`key`) and its value (`value`, the caller's to change, or TOMBSTONE). A run of the disk
    tier indexed from its index entry (`runindex`) is read at the first look-up that lands in
    it, or by `PointReader.prefetch`, whichever comes first; an append's key and value columns
    are decoded at the first look-up that needs them."""

    __slots__ = ("_read", "_run", "_keys", "_values", "_lock")

    def __init__(self, run: Any = None, read: Any = None, keys: tuple | None = None) -> None:
        self._run = run
        self._read = read
        self._keys = keys
        self._values: list | None = None
        self._lock = threading.Lock() if run is None else None

    def run(self) -> Any:
        """The run, read once (a look-up and a prefetch may ask at once)."""
        run = self._run
        if run is None:
            with self._lock:
                run = self._run
                if run is None:
                    run = self._run = self._read()
        return run

    def key(self, c: int) -> Any:
        keys = self._keys
        if keys is None:
            run = self.run()
            if run.hashed:
                return run.key_at(c)
            keys = self._keys = run.keys
        return keys[c]

    def value(self, c: int) -> Any:
        run = self.run()
        if run.hashed:
            return run.value_at(c)
        if self._values is None:
            self._values = run.values
        v = self._values[c]
        return v if v is TOMBSTONE else own(v)


class _Decoded(_Part):
    """A run's latest version of each key, decoded (`entries`)."""

    __slots__ = ()

    def __init__(self, keys: list, values: list) -> None:
        super().__init__(run=True, keys=keys)
        self._values = values

    def key(self, c: int) -> Any:
        return self._keys[c]

    def value(self, c: int) -> Any:
        v = self._values[c]
        return v if v is TOMBSTONE else own(v)


class Stored(NamedTuple):
    """A run of the disk tier with its index entry: its ref, its sorted hashes and their
    columns (`DiskTier.read_index`), and how to read the run itself."""

    ref: Any
    hashes: np.ndarray
    order: np.ndarray
    read: Any

    @property
    def hi(self) -> int:
        """The run's last seq (a reader's choice of runs reads it, as of any run)."""
        return self.ref.hi


def _sorted(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The permutation that sorts `h` (stable), and `h` sorted by it."""
    order = np.argsort(h, kind="stable")
    return order, h[order]


def _index_part(r: Any) -> tuple[_Part, np.ndarray | None, np.ndarray]:
    """What run `r` gives the index: the run as a look-up reads it, the column of each of its
    sorted hashes (None: a merged run's column is in hash order), and its sorted hashes."""
    if type(r) is Stored:
        return _Part(read=r.read), r.order, r.hashes
    if isinstance(r, RunView):
        if r.hashed and not bool(np.any(r.order != np.arange(r.n))):
            return _Part(r), None, r.hashes
        if not r.hashed and not r.npairs and not r.flags & MULTI:
            got = sorted_hashes(r.keys)
            if got is not None:
                return _Part(r, keys=r.keys), *got
            # a key written twice (the later wins) or two keys sharing a hash: decoded below
    # its latest version of each key, decoded (a pending run, one with pairs: small; or the
    # state's whole image, decoded by a load anyway)
    keys, values, _, h = r.entries()
    order, h = _sorted(h.astype(_U64))
    return _Decoded(keys, values), order, h


class PointReader:
    """Look-ups of one state as of seq `at` over `runs` (newest first: what a read as of `at`
    needs, `Store._runs`); `where` names the store in errors."""

    def __init__(self, runs: list, at: int, where: str) -> None:
        self.at = at
        self.where = where
        self.top = [r for r in runs if r.hi > at]
        """The run whose range holds `at` (at most one): read with its history."""
        self._runs: list = []
        self._orders: list = []
        """Per run, the column of each of its sorted hashes (None: a merged run's column is in
        hash order)."""
        hashes = []
        for r in runs:
            if r.hi <= at:
                run, order, h = _index_part(r)
                self._runs.append(run)
                self._orders.append(order)
                hashes.append(h)
        self._starts = np.cumsum([0, *map(len, hashes)])[:-1]
        """Where each run's entries start in the concatenation of their sorted hashes."""
        n = self.entries = sum(map(len, hashes))
        """Entries indexed: every run's latest versions."""
        self._bits = np.uint64(max(1, (n - 1).bit_length()))
        """Low bits of an index entry that hold its place in the concatenation."""
        self._place = np.uint64((1 << int(self._bits)) - 1)
        if hashes:
            # one u64 an entry: its hash's high bits, then its place in the concatenation of the
            # runs' sorted hashes (newest run first). Sorted (a stable sort merges the sorted
            # parts), equal high bits come newest run first; sorting values, not a permutation,
            # takes half the time of `argsort` and half the memory
            self._index = np.concatenate(hashes) >> self._bits << self._bits
            self._index |= np.arange(n, dtype=_U64)
            self._index.sort(kind="stable")
        else:
            self._index = np.zeros(0, _U64)

    def prefetch(self, stop: Any) -> None:
        """Reads the runs indexed from their index entries that no look-up has read yet, newest
        first, until `stop()` is true (on a thread of its own: LevelDB's reads give the
        interpreter lock up, and a look-up that lands in a run then finds it read)."""
        for part in self._runs:
            if stop():
                return
            part.run()

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key` as of `at` (the caller's to change), or `default`: what
        `Store.get(state, key, as_of=at)` answers. A key `Store.append` would refuse is refused
        with KeyEncodingError."""
        key = read_key(key, self.where)
        h = read_hash(key, self.where)
        v = self.lookup(key, h)
        return default if v is MISSING or v is TOMBSTONE else v

    def lookup(self, key: Any, h: int) -> Any:
        """The value of `key` (hash `h`) as of `at`: a value the caller owns, TOMBSTONE (deleted
        there), or MISSING (no run holds it)."""
        for r in self.top:
            v = r.lookup(key, h, self.at)
            if v is not MISSING:
                return v
        index = self._index
        bits = self._bits
        high = np.uint64(h) >> bits
        i = int(index.searchsorted(high << bits))
        n = self.entries
        while i < n and index[i] >> bits == high:
            p = int(index[i] & self._place)
            rank = int(self._starts.searchsorted(p, "right")) - 1
            run = self._runs[rank]
            c = p - int(self._starts[rank])
            order = self._orders[rank]
            if order is not None:
                c = int(order[c])
            if run.key(c) == key:
                return run.value(c)
            i += 1
        return MISSING

"""Point reads of one state as of one seq, through one index of every run's key hashes.

`Store.get` searches a state's runs newest first, each by a binary search of its own hash
column: a look-up costs a few microseconds per run it passes. A state written under a merge
budget has many runs (10^7 keys updated in turn, 2 x 25,000 updates/s, a 0.05 budget: 110 runs
of one worker's state, the keys of each in none of the others), so a key read alone cost
about 40 us, more than a record's whole processing.

A `PointReader` (`Store.reader`) takes the runs a read as of `at` needs, once, and sorts the
key hashes of all of them into one array (each run's column is sorted already: a stable sort
merges them, newest run first among equal hashes), with where each came from. A
look-up is one binary search, then the key and its value decoded from one block of the run
that holds it, whatever the number of runs. The run whose seq range holds `at` (its history
may hold the version as of `at`) is read by its own look-up first; it is the newest the read
needs, since runs of one state do not overlap.

The reader keeps the runs it indexed: merges meanwhile replace them on the disk tier, not in
the reader, which stays a consistent view as of `at` for as long as it lives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lsm.codec import TOMBSTONE, key_hash
from lsm.errors import KeyEncodingError
from lsm.keys import KEY_TYPES, decode_key, encode_key
from lsm.run import MISSING, RunView, own

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


class PointReader:
    """Look-ups of one state as of seq `at` over `runs` (newest first: what a read as of `at`
    needs, `Store._runs`); `where` names the store in errors."""

    def __init__(self, runs: list, at: int, where: str) -> None:
        self.at = at
        self.where = where
        self.top = [r for r in runs if r.hi > at]
        """The run whose range holds `at` (at most one): read with its history."""
        indexed = [r for r in runs if r.hi <= at]
        self._runs: list = []
        hashes = []
        for r in indexed:
            if isinstance(r, RunView) and r.hashed and not bool(np.any(r.order != np.arange(r.n))):
                self._runs.append(r)
                hashes.append(r.hashes)
            else:
                # an append's run: its latest version of each key, decoded (it is small, or
                # the state's whole image, decoded by a load anyway), hashed in its order
                keys, values, _, h = r.entries()
                self._runs.append((keys, values))
                hashes.append(h.astype(_U64))
        self._starts = np.cumsum([0, *map(len, hashes)])[:-1]
        """Where each run's entries start in the concatenation of their hash columns."""
        if hashes:
            h = np.concatenate(hashes)
            self._pos = np.argsort(h, kind="stable")  # newest run first among equal hashes
            self._h = h[self._pos]
        else:
            self._h = np.zeros(0, _U64)
            self._pos = np.zeros(0, np.int64)
        self.entries = len(self._h)
        """Entries indexed: every run's latest versions."""

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
        hs = self._h
        hu = np.uint64(h)
        i = int(hs.searchsorted(hu))
        n = self.entries
        while i < n and hs[i] == hu:
            p = int(self._pos[i])
            rank = int(self._starts.searchsorted(p, "right")) - 1
            run = self._runs[rank]
            c = p - int(self._starts[rank])
            if type(run) is tuple:
                if run[0][c] == key:
                    v = run[1][c]
                    return v if v is TOMBSTONE else own(v)
            elif run.key_at(c) == key:
                return run.value_at(c)
            i += 1
        return MISSING

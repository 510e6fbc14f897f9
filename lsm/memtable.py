"""The memory tier: memtables of packed update batches, indexed lazily.

`append` only packs the batch (msgpack, which also copies it, so a caller may reuse its list)
and adds it here: no per-update Python work on the write path. The first read after appends
decodes the new batches into `latest`, a dict of each key's newest value in this memtable
(built with dict.update, at C speed). An as-of read that falls inside the memtable's seq range
builds `versions` (key -> [(seq, value)]) once, on demand.

A memtable is frozen (no more appends) when it is full, on a flush, or on a snapshot; a frozen
memtable is immutable, which is what makes a snapshot's view copy-on-write: the persister reads
frozen memtables without a lock while the writer fills a new one.
"""

from __future__ import annotations

import time
from bisect import bisect_right

from lsm.codec import unpack

MISSING = object()


class Memtable:
    __slots__ = (
        "batches",
        "first",
        "last",
        "updates",
        "nbytes",
        "created",
        "_latest",
        "_decoded",
        "_versions",
    )

    def __init__(self) -> None:
        self.batches: list[tuple[int, bytes]] = []
        self.first = -1
        self.last = -1
        self.updates = 0
        self.nbytes = 0
        self.created = time.monotonic()
        self._latest: dict = {}
        self._decoded = 0
        self._versions: dict | None = None

    def add(self, seq: int, packed: bytes, n: int) -> None:
        """REQUIRES: seq is above every seq already here; the memtable is not frozen."""
        if not self.batches:
            self.first = seq
            self.created = time.monotonic()
        self.batches.append((seq, packed))
        self.last = seq
        self.updates += n
        self.nbytes += len(packed)
        self._versions = None

    def latest(self) -> dict:
        """Each key's newest value in this memtable (TOMBSTONE for a deletion)."""
        batches = self.batches
        if self._decoded < len(batches):
            latest = self._latest
            for _, packed in batches[self._decoded :]:
                latest.update(unpack(packed))
            self._decoded = len(batches)
        return self._latest

    def _version_index(self) -> dict:
        if self._versions is None:
            versions: dict = {}
            for seq, packed in self.batches:
                for key, value in unpack(packed):
                    versions.setdefault(key, []).append((seq, value))
            self._versions = versions
        return self._versions

    def lookup(self, key: object, as_of: int | None) -> object:
        """The value of `key` as of `as_of` from this memtable alone, or MISSING."""
        if as_of is None or as_of >= self.last:
            return self.latest().get(key, MISSING)
        if as_of < self.first:
            return MISSING
        chain = self._version_index().get(key)
        if not chain:
            return MISSING
        i = bisect_right(chain, as_of, key=lambda v: v[0])
        return chain[i - 1][1] if i else MISSING

    def items(self, as_of: int | None) -> dict:
        """Every key's value as of `as_of` from this memtable alone."""
        if as_of is None or as_of >= self.last:
            return self.latest()
        if as_of < self.first:
            return {}
        out = {}
        for key, chain in self._version_index().items():
            i = bisect_right(chain, as_of, key=lambda v: v[0])
            if i:
                out[key] = chain[i - 1][1]
        return out

    def cut_after(self, seq: int) -> None:
        """Drops the batches above `seq` (rollback). The memtable may become empty."""
        keep = [b for b in self.batches if b[0] <= seq]
        if len(keep) == len(self.batches):
            return
        dropped = self.batches[len(keep) :]
        self.batches = keep
        self.last = keep[-1][0] if keep else -1
        if not keep:
            self.first = -1
        self.nbytes -= sum(len(p) for _, p in dropped)
        self.updates -= sum(len(unpack(p)) for _, p in dropped)
        self._latest = {}
        self._decoded = 0
        self._versions = None

"""The disk tier: every run in LevelDB (plyvel), one entry a run, found by its state and seq.

Layout (FORMAT.md), with p = encode_key(state) (prefix-free, so one state's entries lie together):

    0x01 | p | hi u64 BE   ->  the run's bytes
    0x02 | p | hi u64 BE   ->  the run's header (the catalog: read on open without the runs)
    0x03 | p | hi u64 BE   ->  the run's sorted key hashes (`runindex`), where it has them
    0x00 "applied"         ->  (highest seq indexed + 1) u64 BE
    0x00 "horizon"         ->  (compaction horizon + 1) u64 BE
    0x00 "rollback"        ->  (seq of a rollback under way + 1) u64 BE
    0x00 "standin"         ->  (seq of the log's stand-in record + 1) u64 BE

A seq's runs, their catalog entries and the `applied` marker go in one LevelDB write batch, so
the runs and the marker agree after any crash; a merge replaces runs the same way. LevelDB
protects its own files with its own CRCs; every run also carries its own checksum.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import plyvel

from lsm import runindex
from lsm.run import FULL, HEADER

META_APPLIED = b"\x00applied"
META_HORIZON = b"\x00horizon"
META_ROLLBACK = b"\x00rollback"
META_STANDIN = b"\x00standin"
RUN = b"\x01"
CATALOG = b"\x02"
INDEX = b"\x03"
_SEQ = struct.Struct(">Q")

LEVELDB_OPTIONS = dict(
    create_if_missing=True,
    write_buffer_size=64 << 20,
    # runs are packed columns that block compression barely shrinks; uncompressed, a memtable
    # flush and a read of a run cost a copy, not a codec pass (a seed of 95 MB: 1.06 s with
    # snappy, 0.45 s without; its first open 0.2 s and 0.002 s)
    compression=None,
    lru_cache_size=64 << 20,
    block_size=16 << 10,
    max_open_files=1000,
)
"""The LevelDB options of the disk tier (the benchmark's raw LevelDB figures use the same)."""


class RunRef(NamedTuple):
    """Where a run is and what its header says: enough to choose the runs a read needs."""

    state: bytes
    lo: int
    hi: int
    n: int
    ndel: int
    nhist: int
    hmin: int
    hmax: int
    nbytes: int
    npairs: int
    full: bool = False
    """Whether the run holds every live key of its state (`run.FULL`)."""
    checksum: int = 0
    """The run's checksum (its header's): what its index entry names (`runindex`)."""


def ref_of(state: bytes, header: bytes, nbytes: int) -> RunRef:
    """The ref of a run of `state` from its header bytes and its size."""
    f = HEADER.unpack_from(header, 0)
    return RunRef(state, f[3], f[4], f[5], f[6], f[7], f[9], f[10], nbytes, f[8], bool(f[2] & FULL), f[11])


def _meta_int(db: plyvel.DB, key: bytes, default: int) -> int:
    raw = db.get(key)
    return default if raw is None else _SEQ.unpack(raw)[0] - 1


def _meta_bytes(value: int) -> bytes:
    return _SEQ.pack(value + 1)


class DiskTier:
    """The disk tier of one store: its runs, their catalog and its markers in one LevelDB."""

    def __init__(self, path: str, hash_keys: bool = True) -> None:
        self.path = path
        self.hash_keys = hash_keys
        """Whether a run of one append written without its index entry gets one made here (its
        keys hashed); a merged run's is made either way."""
        self.db = plyvel.DB(path, **LEVELDB_OPTIONS)
        self.applied = _meta_int(self.db, META_APPLIED, -1)
        self.horizon = _meta_int(self.db, META_HORIZON, -1)
        self.standin = _meta_int(self.db, META_STANDIN, -1)
        """The seq whose log record (empty) stands in for runs only this tier holds (-1: none)."""
        self.wrote = False
        """Whether anything was written since the open (else LevelDB's memtable is empty)."""

    @staticmethod
    def _key(kind: bytes, state: bytes, hi: int) -> bytes:
        return kind + state + _SEQ.pack(hi)

    def catalog(self) -> list[RunRef]:
        """Every run on the tier, by state, then seq."""
        out = []
        for k, header in self.db.iterator(prefix=CATALOG):
            nbytes = _SEQ.unpack_from(header, HEADER.size)[0]
            out.append(ref_of(k[1:-8], header, nbytes))
        return out

    def read(self, ref: RunRef, snapshot: object | None = None) -> bytes | None:
        """The bytes of the run `ref` names (through `snapshot` if given), or None if the tier no
        longer holds it."""
        # not through LevelDB's block cache: a reader keeps the run it read (`Store._run_view`),
        # and a run's blocks, of megabytes, would only evict one another (a restore's 667 MB of
        # runs read in 0.47 s through the cache, 0.18 s around it)
        return (snapshot or self.db).get(self._key(RUN, ref.state, ref.hi), fill_cache=False)

    def read_index(self, ref: RunRef, snapshot: object | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The sorted key hashes of the run `ref` names and the column of each (its index entry,
        `runindex`), or None: no entry, or one that is not that run's."""
        entry = (snapshot or self.db).get(self._key(INDEX, ref.state, ref.hi), fill_cache=False)
        return runindex.read(entry, ref.checksum, ref.n)

    def write(
        self,
        added: Iterable[tuple],
        removed: Iterable[RunRef] = (),
        applied: int | None = None,
        sync: bool = False,
    ) -> list[RunRef]:
        """One LevelDB write batch: the runs `added` ((state, run bytes) pairs, or (state, run
        bytes, index entry) triples whose entry was made already) with their catalog and index
        entries, the runs `removed` gone, and the applied marker at `applied`. Returns the refs
        of the runs added."""
        self.wrote = True
        refs = []
        wb = self.db.write_batch(sync=sync)
        for ref in removed:
            wb.delete(self._key(RUN, ref.state, ref.hi))
            wb.delete(self._key(CATALOG, ref.state, ref.hi))
            wb.delete(self._key(INDEX, ref.state, ref.hi))
        for state, data, *made in added:
            ref = ref_of(state, data, len(data))
            wb.put(self._key(RUN, state, ref.hi), data)
            wb.put(self._key(CATALOG, state, ref.hi), data[: HEADER.size] + _SEQ.pack(len(data)))
            entry = made[0] if made else runindex.of_run(data, hash_keys=self.hash_keys)
            if entry is None:
                wb.delete(self._key(INDEX, state, ref.hi))  # a run written again at its seq
            else:
                wb.put(self._key(INDEX, state, ref.hi), entry)
            refs.append(ref)
        if applied is not None:
            wb.put(META_APPLIED, _meta_bytes(applied))
        wb.write()
        if applied is not None:
            self.applied = applied
        return refs

    def set_horizon(self, horizon: int) -> None:
        """Makes the horizon durable: as-of reads below it are refused from now on, before
        any version they would need is dropped."""
        self.wrote = True
        self.db.put(META_HORIZON, _meta_bytes(horizon), sync=True)
        self.horizon = horizon

    def rollback_marker(self) -> int | None:
        """The seq of a rollback begun and not finished (a crash part-way), or None."""
        raw = self.db.get(META_ROLLBACK)
        return None if raw is None else _SEQ.unpack(raw)[0] - 1

    def begin_rollback(self, seq: int) -> None:
        """Makes the intent to roll back to `seq` durable: an open finishes what a crash left."""
        self.wrote = True
        self.db.put(META_ROLLBACK, _meta_bytes(seq), sync=True)

    def set_standin(self, seq: int) -> None:
        """Makes durable that the log's record of `seq` is a stand-in (empty) for runs only this
        tier holds: the remote tier must get them from a base image, not from the log. -1 clears
        it."""
        self.wrote = True
        if seq < 0:
            self.db.delete(META_STANDIN, sync=True)
        else:
            self.db.put(META_STANDIN, _meta_bytes(seq), sync=True)
        self.standin = seq

    def end_rollback(self) -> None:
        """Clears the rollback marker: the rollback `begin_rollback` announced is finished."""
        self.db.delete(META_ROLLBACK, sync=True)

    def snapshot(self) -> object:
        """A consistent view of the tier as it is now (reads through it ignore later writes)."""
        return self.db.snapshot()

    def compact_files(self) -> None:
        """Asks LevelDB to rewrite its files, so that removed runs free their space."""
        self.db.compact_range(start=b"\x00", stop=b"\xff")

    def close(self, settle: bool = False) -> None:
        """Closes LevelDB; with `settle`, first writes its memtable out as a table, so that
        the next open (of these files or of a copy) has no write-ahead log to recover."""
        if not self.db.closed:
            try:
                if settle and self.wrote:
                    # a range no table holds: LevelDB flushes the memtable, compacts nothing
                    # (not after reads alone: the flush would wait behind LevelDB's own
                    # background compaction, which an open may have started)
                    self.db.compact_range(start=b"\x00", stop=b"\x00")
            finally:
                self.db.close()

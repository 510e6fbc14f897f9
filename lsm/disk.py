"""The disk tier: every version of every key in LevelDB (plyvel), found by one seek.

Layout (FORMAT.md): a version of key k written at seq s is the LevelDB entry

    encode_key(k) + (2**64 - 1 - s) as u64 big-endian  ->  msgpack(value), or b"" for a deletion

Inverting the seq sorts a key's versions newest first, so `get(k, as_of=s)` is one seek to
`encode_key(k) + inverted(s)`: the first entry at or after it is the newest version <= s, if it
still belongs to k. Metadata lives under keys that start with 0x00, which no encoded key does,
and is written in the same LevelDB write batch as the data it describes, so that `applied`
(the highest seq indexed here) and the data agree after any crash.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import plyvel

from lsm.codec import TOMBSTONE, make_packer, unpack, unpack_value
from lsm.keys import encode_key, mvcc_key, split_mvcc_key
from lsm.memtable import MISSING
from lsm.records import Record

META_APPLIED = b"\x00applied"
META_HORIZON = b"\x00horizon"
DATA_START = b"\x01"
_SEQ = struct.Struct(">Q")
_INV = (1 << 64) - 1
_LAST = b"\xff" * 8
"""The inverted seq of seq 0: no version of a key sorts after it."""
SEEK_AFTER = 4
"""Versions of one key an as-of scan steps over before it seeks instead."""
CHUNK_BYTES = 128 << 10
WRITES_IN_FLIGHT = 2

LEVELDB_OPTIONS = dict(
    create_if_missing=True,
    write_buffer_size=64 << 20,
    lru_cache_size=64 << 20,
    block_size=16 << 10,
    max_open_files=1000,
)
"""The LevelDB options of the disk tier (the benchmark's raw LevelDB figures use the same)."""


def _meta_int(db: plyvel.DB, key: bytes, default: int) -> int:
    raw = db.get(key)
    return default if raw is None else _SEQ.unpack(raw)[0] - 1


def _meta_bytes(value: int) -> bytes:
    return _SEQ.pack(value + 1)


class DiskTier:
    def __init__(self, path: str) -> None:
        self.path = path
        self.db = plyvel.DB(path, **LEVELDB_OPTIONS)
        self.applied = _meta_int(self.db, META_APPLIED, -1)
        self.horizon = _meta_int(self.db, META_HORIZON, -1)
        self._packer = make_packer()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="lsm-leveldb-writer")
        self.wrote = False
        """Whether anything was written since the open (else LevelDB's memtable is empty)."""

    def _write(self, wb: plyvel.WriteBatch, seq: int) -> None:
        self.wrote = True
        wb.write()
        self.applied = seq

    def apply(self, batches: list[tuple[int, bytes]]) -> None:
        """Indexes update batches (sorted by seq, all above `applied`) into LevelDB.

        Builds write batches of about CHUNK_BYTES, each carrying the `applied` marker of its
        last update batch, and hands them to a writer thread: LevelDB's write releases the GIL,
        so building the next chunk in Python overlaps writing the previous one. Returns when
        every chunk is written. Called by the persister thread only.
        """
        db = self.db
        pack = self._packer.pack
        tomb = TOMBSTONE
        in_flight: deque[Future] = deque()
        try:
            wb = db.write_batch()
            put = wb.put
            size = wb.approximate_size
            last = len(batches) - 1
            for i, (seq, packed) in enumerate(batches):
                inv = _SEQ.pack(_INV - seq)
                for k, v in unpack(packed):
                    if type(k) is bytes:
                        ek = b"\x06" + k.replace(b"\x00", b"\x00\xff") + b"\x00\x01"
                    else:
                        ek = encode_key(k)
                    put(ek + inv, b"" if v is tomb else pack(v))
                if i == last or size() >= CHUNK_BYTES:
                    put(META_APPLIED, _meta_bytes(seq))
                    if len(in_flight) >= WRITES_IN_FLIGHT:
                        in_flight.popleft().result()
                    in_flight.append(self._writer.submit(self._write, wb, seq))
                    wb = db.write_batch()
                    put = wb.put
                    size = wb.approximate_size
        finally:
            for f in in_flight:
                f.result()

    def get(self, it: plyvel.RawIterator, ekey: bytes, as_of: int) -> object:
        """The value of the encoded key as of `as_of`, TOMBSTONE, or MISSING when absent."""
        it.seek(ekey + _SEQ.pack(_INV - as_of))
        if not it.valid():
            return MISSING
        k = it.key()
        if k[:-8] != ekey:
            return MISSING
        return unpack_value(it.value())

    def scan(self, prefix: bytes, as_of: int) -> Iterator[tuple[bytes, object]]:
        """(encoded key, value) of every key under `prefix` as of `as_of`, tombstones included."""
        for ekey, raw in self.scan_raw(prefix, as_of):
            yield ekey, unpack_value(raw)

    def rollback(self, seq: int, records: list[Record] | None) -> None:
        """Deletes every version above `seq`. With the log's records of those seqs, only their
        keys are visited; without them (the log was trimmed), the whole tier is scanned."""
        self.wrote = True
        wb = self.db.write_batch(sync=True)
        if records is not None:
            for rec in records:
                if rec.seq > self.applied:
                    break
                inv = _SEQ.pack(_INV - rec.seq)
                for k, _ in unpack(rec.packed):
                    wb.delete(encode_key(k) + inv)
        else:
            for mkey in self.db.iterator(start=DATA_START, include_value=False):
                if split_mvcc_key(mkey)[1] > seq:
                    wb.delete(mkey)
        new_applied = min(self.applied, seq)
        wb.put(META_APPLIED, _meta_bytes(new_applied))
        wb.write()
        self.applied = new_applied

    def collect(self, horizon: int, yield_every: int = 4096) -> int:
        """Drops the versions no read at or after `horizon` can see; returns how many.

        Per key (newest first): versions above `horizon` stay; the newest one at or below it is
        the key's state at the horizon and stays unless it is a deletion; older ones go.
        REQUIRES: horizon <= applied (versions indexed later are all above it).

        Crash-safe by its order: the new horizon is made durable (and refuses older as-of
        reads) before any version goes, and the deletions are written in chunks that end
        between keys, never inside one (a tombstone deleted without the older versions it
        hides would bring them back). A crash part-way changes no read at or after `horizon`.
        """
        self.wrote = True
        self.db.put(META_HORIZON, _meta_bytes(horizon), sync=True)
        self.horizon = horizon
        dropped = 0
        wb = self.db.write_batch()
        pending = 0
        current = None
        kept_base = False
        visited = 0
        with self.db.iterator(start=DATA_START, include_value=True) as it:
            for mkey, raw in it:
                ekey, seq = split_mvcc_key(mkey)
                if ekey != current:
                    if visited >= yield_every:
                        if pending:
                            wb.write()
                            dropped += pending
                            pending = 0
                            wb = self.db.write_batch()
                        visited = 0
                        time.sleep(0)
                    current = ekey
                    kept_base = False
                if seq > horizon:
                    continue
                if kept_base or not raw:
                    wb.delete(mkey)
                    pending += 1
                kept_base = True
                visited += 1
        wb.write()
        return dropped + pending

    def compact_files(self) -> None:
        """Asks LevelDB to rewrite its files, so that deleted versions free their space."""
        self.db.compact_range(start=b"\x00", stop=b"\xff")

    def close(self, settle: bool = False) -> None:
        """Closes LevelDB; with `settle`, first writes its memtable out as a table, so that
        the next open (of these files or of a copy) has no write-ahead log to recover."""
        self._writer.shutdown(wait=True)
        if not self.db.closed:
            try:
                if settle and self.wrote:
                    # a range no table holds: LevelDB flushes the memtable, compacts nothing
                    # (not after reads alone: the flush would wait behind LevelDB's own
                    # background compaction, which an open may have started)
                    self.db.compact_range(start=b"\x00", stop=b"\x00")
            finally:
                self.db.close()

    def load_image(self, seq: int, keys: list[bytes], values: list[bytes]) -> None:
        """Fills an empty tier with a base image: every key's value as a version at `seq`,
        which becomes both the applied point and the horizon (nothing older is known)."""
        self.wrote = True
        wb = self.db.write_batch(sync=True)
        for k, v in zip(keys, values, strict=True):
            wb.put(mvcc_key(k, seq), v)
        wb.put(META_APPLIED, _meta_bytes(seq))
        wb.put(META_HORIZON, _meta_bytes(seq))
        wb.write()
        self.applied = self.horizon = seq

    def image(self, seq: int) -> tuple[list[bytes], list[bytes]]:
        """Encoded keys and packed values of every live key as of `seq` (for a base image)."""
        keys: list[bytes] = []
        values: list[bytes] = []
        for ekey, value in self.scan_raw(b"", seq):
            if value:
                keys.append(ekey)
                values.append(value)
        return keys, values

    def scan_raw(self, prefix: bytes, as_of: int) -> Iterator[tuple[bytes, bytes]]:
        """Like `scan`, with values left packed (b"" for a deletion).

        A key's versions lie newest first; past SEEK_AFTER versions to pass over in a row, the
        iterator seeks (to the first version at or below `as_of`, or past the key's last),
        so a key with a long history costs two seeks, not a step per version."""
        if as_of < 0:
            return  # no version is old enough
        # a version is newer than as_of when its inverted seq sorts below this one's (the
        # 8 bytes compare as the numbers they encode)
        floor = _SEQ.pack(_INV - as_of)
        done = None
        passed = 0
        # LevelDB bounds the iteration (and the seeks below) to the prefix
        it = self.db.iterator(prefix=prefix) if prefix else self.db.iterator(start=DATA_START)
        with it:
            for mkey, raw in it:
                ekey = mkey[:-8]
                if ekey == done or mkey[-8:] < floor:
                    passed += 1
                    if passed >= SEEK_AFTER:
                        # the prefix-free encoding puts every version of ekey between these
                        it.seek(ekey + (_LAST if ekey == done else floor))
                        passed = 0
                    continue
                done = ekey
                passed = 0
                yield ekey, raw

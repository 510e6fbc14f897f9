"""The store: the write path, the read path, rollback, snapshots, and opening a directory.

One thread calls the store's methods (the API thread); one background thread, the persister
(persister.py), moves frozen memtables down the tiers. They share state under two locks:

- `_lock` (with the condition `_cond`) guards the memtable list, the read view and the
  counters; it is held for microseconds, never across I/O;
- `_tier_lock` guards the log, the disk tier and the remote tier; the persister holds it for
  one step at a time, and rollback/compact/close take it to act on the tiers themselves.

Readers never lock: `_view` is one tuple (memtables newest first, disk generation) replaced
whole. A memtable leaves the view only after LevelDB holds its updates, and the generation
changes with it, which tells the reader to take a fresh LevelDB iterator (an iterator sees
LevelDB as it was when it was made).

Directory layout: LOCK, MANIFEST, log/ (segments), disk/ (LevelDB), and by default remote/
(the remote tier when no URI is given).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from lsm import files
from lsm.codec import TOMBSTONE, make_packer, unpack
from lsm.disk import DiskTier
from lsm.errors import (
    KeyEncodingError,
    LsmError,
    PersistError,
    RetentionError,
    SeqOrderError,
    StoreClosedError,
    StoreLockedError,
)
from lsm.keys import KEY_TYPES, MAX_SEQ, check_keys, decode_items, decode_key, encode_key, encode_prefix
from lsm.log import Log
from lsm.manifest import Manifest, read_manifest, write_manifest
from lsm.memtable import MISSING, Memtable
from lsm.records import Record
from lsm.remote import RemoteTier

LEVELS = ("memory", "disk", "remote")
DEFAULT_REMOTE = ""
"""The manifest's name for the default remote tier, `<store>/remote`: kept relative, so a copied
store directory does not write to the original's remote tier."""


@dataclass
class StoreOptions:
    """Tuning of one store. Sizes count updates (key/value pairs) unless named bytes."""

    retention: int = 10_000
    """Versions newer than `last seq - retention` survive compaction: the as-of/rollback window."""
    memtable_updates: int = 65_536
    """A memtable freezes (and goes to the persister) when it holds this many updates."""
    memory_updates: int = 1 << 20
    """Memory bound: `append` waits (backpressure, counted in stats) while more updates than
    this are in memory, not yet indexed on the disk tier."""
    flush_interval_s: float = 0.2
    """A non-empty memtable older than this is frozen, so durability never lags much more."""
    segment_bytes: int = 64 << 20
    """A log segment is sealed (and uploaded) at this size."""
    seal_interval_s: float = 5.0
    """A non-empty log segment older than this is sealed and uploaded."""
    compact_every_updates: int = 8 << 20
    """The persister runs compaction after indexing this many updates (0: never by itself)."""
    uploads: bool = True
    """False: nothing goes to the remote tier (a copy of a store, opened to be read)."""


@dataclass
class StoreStats:
    appended_updates: int = 0
    logged_bytes: int = 0
    indexed_updates: int = 0
    uploaded_bytes: int = 0
    backpressure_s: float = 0.0
    compactions: int = 0
    versions_dropped: int = 0
    persist_errors: int = 0
    extra: dict = field(default_factory=dict)


class Snapshot:
    """A consistent view of the store as of `seq`, pinned against compaction until released.

    Taking it freezes the memtable (copy-on-write: the writer goes on in a new one); its
    persistence completes in the background, `wait(level)` waits for it.
    """

    def __init__(self, store: Store, seq: int) -> None:
        self.store = store
        self.seq = seq
        self._released = False

    def get(self, key: object, default: object = None) -> object:
        return self.store.get(key, as_of=self.seq, default=default)

    def scan(self, prefix: object = None) -> Iterator[tuple[object, object]]:
        return self.store.scan(prefix, as_of=self.seq)

    def durable(self, level: str = "disk") -> bool:
        return self.store.durable(level) >= self.seq

    def wait(self, level: str = "disk", timeout: float | None = None) -> None:
        """Blocks until the snapshot is durable on `level`; raises PersistError on failure."""
        self.store._wait_durable(level, self.seq, timeout)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.store._unpin(self.seq)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Store:
    """A log-structured, sequence-numbered, versioned key-value store.

    >>> s = Store("/tmp/state")                     # doctest: +SKIP
    >>> s.append(1, [("a", 1), ("b", 2)])           # doctest: +SKIP
    >>> s.append(2, [("a", 10), ("b", TOMBSTONE)])  # doctest: +SKIP
    >>> s.get("a"), s.get("a", as_of=1), s.get("b") # doctest: +SKIP
    (10, 1, None)
    """

    def __init__(self, path: str, remote: str | None = None, **options: object) -> None:
        unknown = set(options) - set(StoreOptions.__dataclass_fields__)
        if unknown:
            raise LsmError(f"unknown store option(s): {', '.join(sorted(unknown))}")
        self.path = os.path.abspath(path)
        self.options = StoreOptions(**options)  # type: ignore[arg-type]
        self.stats = StoreStats()
        self._closed = True
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = self._take_lock()
        try:
            self._open(remote)
        except BaseException:
            self._release_handles()
            raise
        self._closed = False
        from lsm.persister import Persister

        self._persister = Persister(self)
        self._persister.start()

    # -- opening ----------------------------------------------------------------

    def _take_lock(self) -> int:
        lock_path = os.path.join(self.path, "LOCK")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(self.path) from None
        return fd

    def _open(self, remote: str | None) -> None:
        manifest = read_manifest(self.path)
        created = manifest is None
        if manifest is None:
            manifest = Manifest.new(remote or DEFAULT_REMOTE)
        elif remote is not None and remote != manifest.remote:
            raise LsmError(f"store {self.path} keeps its remote tier at {manifest.remote}, not {remote}")
        self._disk: DiskTier | None = None
        self._log: Log | None = None
        self.remote = RemoteTier(
            os.path.join(self.path, "remote") if manifest.remote == DEFAULT_REMOTE else manifest.remote
        )
        fresh = not os.path.exists(os.path.join(self.path, "disk"))
        if created:
            write_manifest(self.path, manifest)
        self.manifest = manifest
        self._disk = DiskTier(os.path.join(self.path, "disk"))
        self._log = Log(os.path.join(self.path, "log"), self.options.segment_bytes)
        if fresh and self.remote.files:
            self._restore_from_remote()
        replay = self._log.open(after=self._disk.applied)
        local_last = max(self._log.last_seq, self._disk.applied)
        replay += self._remote_records_after(local_last)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tier_lock = threading.RLock()
        self._packer = make_packer()
        self._frozen: list[Memtable] = []
        self._active = Memtable()
        self._mem_updates = 0
        self._pins: dict[int, int] = {}
        self._error: PersistError | None = None
        self._failures = 0
        self._iter_gen = -1
        self._iter = None
        if replay:
            m = Memtable()
            for rec in replay:
                m.add(rec.seq, rec.packed, len(unpack(rec.packed)))
            self._frozen.append(m)
            self._mem_updates = m.updates
        self._last = max(local_last, replay[-1].seq if replay else -1)
        self._logged = self._last
        self._durable_disk = self._last
        self._durable_remote = self.remote.durable()
        self._gen = 0
        self._publish_locked()

    def _remote_records_after(self, seq: int) -> list[Record]:
        """Records the remote tier holds beyond the local log (its tail was lost): they are
        written back to the local log and replayed, so nothing durable is lost."""
        if self.remote.durable() <= seq:
            return []
        by_seq: dict[int, Record] = {}
        for f in self.remote.files:
            if not f.base and f.last > seq:
                # segments may overlap (a rollback rewrote one and crashed before deleting it)
                by_seq.update((r.seq, r) for r in self.remote.read_log(f) if r.seq > seq)
        out = [by_seq[s] for s in sorted(by_seq)]
        if out:
            self._log.seal()
            self._log.append([(r.seq, r.packed) for r in out])
        return out

    def _restore_from_remote(self) -> None:
        """Rebuilds an empty local store from the remote tier: the base image goes to the disk
        tier, the log segments after it to the local log (replayed like any log)."""
        base = self.remote.base
        if base is not None:
            keys, values = self.remote.read_base(base)
            self._disk.load_image(base.last, keys, values)

    # -- writing ------------------------------------------------------------------

    def append(self, seq: int, updates: list | tuple) -> int:
        """Adds the batch `updates` ((key, value) pairs; value TOMBSTONE deletes) at `seq`;
        returns the size of the batch in bytes (msgpack).

        Never waits on disk, except while the memory bound is exceeded (backpressure).
        Raises SeqOrderError unless `seq` is above every seq before it, KeyEncodingError or
        LsmError for a key or value that cannot be stored (nothing is added then).
        """
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if type(seq) is not int or seq <= self._last or seq > MAX_SEQ:
            raise SeqOrderError(
                f"append seq {seq!r} to {self.path}: seqs must be ints above the last one ({self._last})"
            )
        try:
            check_keys(updates)
            packed = self._packer.pack(updates)
        except KeyEncodingError as e:
            raise KeyEncodingError(f"append seq {seq} to {self.path}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            self._packer.reset()
            raise LsmError(
                f"append seq {seq} to {self.path}: updates must be (key, value) pairs of msgpack values: {e}"
            ) from None
        n = len(updates)
        with self._lock:
            m = self._active
            m.add(seq, packed, n)
            self._last = seq
            self._mem_updates += n
            if m.updates >= self.options.memtable_updates:
                self._freeze_locked()
            over = self._mem_updates > self.options.memory_updates
        self.stats.appended_updates += n
        if over:
            self._wait_for_memory()
        return len(packed)

    def _freeze_locked(self) -> None:
        """REQUIRES: _lock held."""
        if self._active.batches:
            self._frozen.append(self._active)
            self._active = Memtable()
            self._publish_locked()
            self._cond.notify_all()

    def _publish_locked(self) -> None:
        """REQUIRES: _lock held (or no other thread yet). Replaces the read view."""
        self._view = ((self._active, *reversed(self._frozen)), self._gen)

    def _wait_for_memory(self) -> None:
        start = time.perf_counter()
        failures = self._failures
        with self._cond:
            while self._mem_updates > self.options.memory_updates and not self._closed:
                if self._failures != failures and self._fails_level("disk"):
                    raise self._error
                self._cond.wait(0.05)
        self.stats.backpressure_s += time.perf_counter() - start

    # -- reading ------------------------------------------------------------------

    def _check_as_of(self, as_of: int | None) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if as_of is not None:
            if type(as_of) is not int:
                raise LsmError(f"as_of must be an int seq or None, not {as_of!r}")
            if as_of < self._disk.horizon:
                raise RetentionError(as_of, self._disk.horizon)

    def _iterator(self, gen: int):
        if gen != self._iter_gen or self._iter is None:
            self._iter = self._disk.db.raw_iterator()
            self._iter_gen = gen
        return self._iter

    def get(self, key: object, as_of: int | None = None, default: object = None) -> object:
        """The value of `key` right after seq `as_of` (None: now), or `default` if it has none.

        Raises RetentionError for an `as_of` older than the retention horizon. The returned
        object is shared with the store's cache: treat it as read-only.
        """
        self._check_as_of(as_of)
        if type(key) not in KEY_TYPES:
            # Refuses what append refuses (a memtable would find key 1 for True or 1.0) and
            # turns lists, at any depth, into the tuples the memtables hold.
            key = decode_key(encode_key(key))[0]
        if as_of is not None and as_of < 0:
            return default
        mems, gen = self._view
        for m in mems:
            if m.batches:
                v = m.lookup(key, as_of)
                if v is not MISSING:
                    return default if v is TOMBSTONE else v
        v = self._disk.get(self._iterator(gen), encode_key(key), MAX_SEQ if as_of is None else as_of)
        return default if v is MISSING or v is TOMBSTONE else v

    def scan(self, prefix: object = None, as_of: int | None = None) -> Iterator[tuple[object, object]]:
        """(key, value) of every live key as of `as_of`, in key order; with `prefix`, only keys
        that start with it (a str/bytes prefix of a str/bytes key, or a tuple prefix)."""
        self._check_as_of(as_of)
        pre = b"" if prefix is None else encode_prefix(prefix)
        mems, _ = self._view
        overlay: dict[bytes, tuple[object, object]] = {}
        for m in reversed(mems):
            if not m.batches:
                continue
            for k, v in m.items(as_of).items():
                ek = encode_key(k)
                if ek.startswith(pre):
                    overlay[ek] = (k, v)
        if not overlay:
            return self._disk_only(prefix, pre, MAX_SEQ if as_of is None else as_of)
        return self._merge(sorted(overlay.items()), pre, MAX_SEQ if as_of is None else as_of)

    def _disk_only(self, prefix: object, pre: bytes, as_of: int) -> Iterator[tuple[object, object]]:
        # nothing in memory to merge (a store reopened, or read as of an indexed seq): the
        # disk tier's versions as they come, deletions skipped
        scan = self._disk.scan_raw(pre, as_of)
        if (type(prefix) is tuple or type(prefix) is list) and prefix:
            # every key is a tuple that starts with the prefix: only the rest is decoded
            head, n = decode_key(pre + b"\x00")[0], len(pre)
            for ek, raw in scan:
                if raw:
                    yield head + decode_items(ek, n)[0], unpack(raw)
        else:
            for ek, raw in scan:
                if raw:
                    yield decode_key(ek)[0], unpack(raw)

    def _merge(self, mem_items: list, pre: bytes, as_of: int) -> Iterator[tuple[object, object]]:
        i = 0
        for ek, v in self._disk.scan(pre, as_of):
            while i < len(mem_items) and mem_items[i][0] < ek:
                k, mv = mem_items[i][1]
                i += 1
                if mv is not TOMBSTONE:
                    yield k, mv
            if i < len(mem_items) and mem_items[i][0] == ek:
                k, mv = mem_items[i][1]
                i += 1
                if mv is not TOMBSTONE:
                    yield k, mv
                continue
            if v is not TOMBSTONE:
                yield decode_key(ek)[0], v
        for _, (k, mv) in mem_items[i:]:
            if mv is not TOMBSTONE:
                yield k, mv

    # -- durability ----------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The highest seq appended (-1 for an empty store)."""
        return self._last

    @property
    def horizon(self) -> int:
        """The oldest seq an as-of read or a rollback may name (-1: all)."""
        return self._disk.horizon

    def durable(self, level: str = "disk") -> int:
        """The highest seq such that everything up to it is on `level` (memory, disk, remote).

        "disk" means written and fsynced to the local log; "remote" means in the remote tier.
        """
        if level == "memory":
            return self._last
        if level == "disk":
            return self._durable_disk
        if level == "remote":
            return self._durable_remote
        raise LsmError(f"unknown durability level {level!r}; levels are {', '.join(LEVELS)}")

    @property
    def indexed(self) -> int:
        """The highest seq indexed on the disk tier: in LevelDB, no longer held in memory (the
        persister's last step for a batch, after `durable("disk")`)."""
        return self._disk.applied

    @property
    def error(self) -> PersistError | None:
        """The persister's last failure, until it succeeds again."""
        return self._error

    def flush(self, level: str = "disk", timeout: float | None = None) -> int:
        """Makes everything appended so far durable on `level` and waits for it.

        Returns the seq made durable. Raises PersistError if the persister fails meanwhile (it
        keeps retrying; a later flush succeeds once the fault clears).
        """
        target = self.persist(level)
        self._wait_durable(level, target, timeout)
        return target

    def persist(self, level: str = "disk") -> int:
        """Starts making everything appended so far durable on `level`, without waiting:
        the caller polls `durable(level)`. Returns the seq it will reach."""
        self.durable(level)
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if level == "remote" and not self.options.uploads:
            raise LsmError(f"store {self.path} was opened with uploads=False: nothing goes to its remote tier")
        with self._cond:
            self._freeze_locked()
            target = self._last
            if level == "remote":
                self._persister.request_seal(target)
            self._cond.notify_all()
        return target

    def _fails_level(self, level: str) -> bool:
        """Whether the persister's current error stands in the way of `level`: a remote
        outage does not fail a wait for the disk tier."""
        err = self._error
        return err is not None and LEVELS.index(err.level) <= LEVELS.index(level)

    def _wait_durable(self, level: str, seq: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = self._failures
        with self._cond:
            while self.durable(level) < seq:
                if self._closed:
                    raise StoreClosedError(f"store {self.path} is closed")
                if self._failures != failures and self._fails_level(level):
                    raise self._error
                if deadline is not None and time.monotonic() >= deadline:
                    raise LsmError(f"{self.path}: seq {seq} not durable on {level} after {timeout}s")
                self._cond.wait(0.05)

    def snapshot(self) -> Snapshot:
        """A consistent view as of the last seq, pinned until released (what ABS uses)."""
        with self._cond:
            self._freeze_locked()
            seq = self._last
            self._pins[seq] = self._pins.get(seq, 0) + 1
        return Snapshot(self, seq)

    def _unpin(self, seq: int) -> None:
        with self._lock:
            n = self._pins.get(seq, 0) - 1
            if n > 0:
                self._pins[seq] = n
            else:
                self._pins.pop(seq, None)

    def compaction_horizon(self) -> int:
        """The seq compaction may compact up to now: retention, pinned snapshots and what the
        disk tier has indexed all bound it."""
        h = min(self._last - self.options.retention, self._disk.applied)
        if self._pins:
            h = min(h, min(self._pins))
        return max(h, self._disk.horizon)

    # -- rollback, compaction --------------------------------------------------------

    def rollback(self, to_seq: int) -> None:
        """Makes the store exactly what it was right after `to_seq`, on every tier.

        Raises RetentionError if `to_seq` is older than the retention horizon.
        Crash-safe by its order: disk tier first, then remote, then the local log, so a crash
        part-way leaves either the old state (the log replays it) or the new one.
        """
        with self._persister.compactor.lock, self._tier_lock:
            # Checked under the compaction lock: a background compaction may have moved the
            # horizon past to_seq while this call waited for the lock.
            self._check_as_of(to_seq)
            if to_seq >= self._last:
                return
            with self._cond:
                keep = []
                for m in self._frozen:
                    m.cut_after(to_seq)
                    if m.batches:
                        keep.append(m)
                self._frozen = keep
                self._active.cut_after(to_seq)
                self._mem_updates = self._active.updates + sum(m.updates for m in keep)
                self._last = to_seq
            records = self._log.records_after(to_seq)
            self._disk.rollback(to_seq, records)
            self.remote.drop_after(to_seq)
            self._log.truncate_after(to_seq)
            with self._cond:
                logged = self._log.last_seq
                self._logged = min(self._logged, logged)
                self._durable_disk = min(self._durable_disk, to_seq)
                mems = [self._active, *self._frozen]
                if to_seq >= 0 and logged != to_seq and not any(m.batches and m.last == to_seq for m in mems):
                    # No batch carries to_seq: an empty one does (it changes no key), so that
                    # last_seq == to_seq is logged, uploaded and survives a crash like any append.
                    empty = self._packer.pack([])
                    if any(m.batches and m.last > self._logged for m in mems):
                        # earlier batches still wait for the log: this one goes after them
                        self._durable_disk = min(self._durable_disk, max(logged, self._disk.applied))
                        self._active.add(to_seq, empty, 0)
                    else:
                        self._log.append([(to_seq, empty)])
                        self._logged = to_seq
                        self._durable_disk = to_seq
                        # logged, and queued for indexing like any frozen memtable, so that the
                        # disk tier's applied point (and so compaction) reaches to_seq too
                        m = Memtable()
                        m.add(to_seq, empty, 0)
                        self._frozen.append(m)
                self._durable_remote = self.remote.durable()
                # A seal requested for a seq above to_seq would otherwise outrank (by max)
                # every later flush("remote") below it, which then waits for seal_interval_s.
                p = self._persister
                p._seal_target = min(p._seal_target, to_seq)
                self._gen += 1
                self._publish_locked()
                self._cond.notify_all()

    def compact(self) -> dict:
        """Flushes, then drops versions older than the retention horizon on every tier and
        has LevelDB rewrite its files. Returns what it did."""
        self.flush("remote")
        self._persister.drain_index()
        return self._persister.compactor.run(full=True)

    def disk_bytes(self) -> dict:
        """Bytes on disk per part: the LevelDB tier, the local log, the remote tier."""
        return {
            "disk": files.tree_bytes(os.path.join(self.path, "disk")),
            "log": files.tree_bytes(os.path.join(self.path, "log")),
            "remote": self.remote.total_bytes(),
        }

    # -- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Makes everything appended durable on the disk tier, stops the persister, unlocks.

        A clean close also indexes every memtable in LevelDB and has LevelDB write its own
        memtable out, so the next open (of these files, or of a copy: rewind and state read
        copies of a run's stores) replays no log of either."""
        if self._closed:
            return
        settle = False
        try:
            self.flush("disk")
            self._persister.drain_index()
            settle = True
        finally:
            self._shutdown(settle)

    def abandon(self) -> None:
        """Closes without flushing: what is not durable is lost, as in a crash (for tests)."""
        if not self._closed:
            self._shutdown()

    def _shutdown(self, settle: bool = False) -> None:
        self._persister.stop()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._iter = None
        self._release_handles(settle)

    def _release_handles(self, settle: bool = False) -> None:
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if getattr(self, "_disk", None) is not None:
            self._disk.close(settle=settle)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

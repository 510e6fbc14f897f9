"""The store: the write path, the read path, rollback, and opening a directory.

A store holds named states (an operator's keyed state, a worker's metadata...). Each `append`
at a new seq gives some of them a run: the changed keys and their values as columns, deletions
marked. One thread calls the store's methods (the API thread); one background thread, the
persister (persister.py), encodes the runs, logs them, indexes them and uploads them; another,
the compactor (compaction.py), merges runs. They share state under two locks:

- `_lock` (with the condition `_cond`) guards the batches not yet indexed, the read view and
  the counters; it is held for microseconds, never across I/O;
- `_tier_lock` guards the log, the disk tier and the remote tier; the persister holds it for
  one step at a time, and rollback/compact/close take it to act on the tiers themselves.

Readers never lock: `_view` is one tuple (batches not yet indexed, the disk tier's catalog, a
LevelDB snapshot) replaced whole. A batch leaves the view only after LevelDB holds its runs.

Directory layout: LOCK, MANIFEST, log/ (segments), disk/ (LevelDB), and by default remote/
(the remote tier when no URI is given).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lsm import files
from lsm.codec import (
    TOMBSTONE,
    joined,
    pack_column,
    pack_keys,
    pack_map_parts,
    pack_values,
    unpack_keys,
)
from lsm.disk import DiskTier, RunRef
from lsm.errors import (
    CorruptLogError,
    KeyEncodingError,
    LookupTooDearError,
    LsmError,
    PersistError,
    RetentionError,
    SeqOrderError,
    StoreClosedError,
    ValueEncodingError,
)
from lsm.keys import KEY_TYPES, MAX_SEQ, check_key_column, decode_key, encode_key
from lsm.log import Log
from lsm.manifest import Manifest, read_manifest, write_manifest
from lsm.persister import Persister, encoded_runs
from lsm.reader import PointReader, Stored, read_hash, read_key
from lsm.records import Record
from lsm.remote import RemoteTier
from lsm.run import IMMUTABLE_TYPES, MISSING, PendingRun, RunView, join_pairs, own, truncate
from lsm.seed import Image

LEVELS = ("memory", "disk", "remote")
DEFAULT_REMOTE = ""
"""The manifest's name for the default remote tier, `<store>/remote`: kept relative, so a copied
store directory does not write to the original's remote tier."""
VIEW_CACHE_BYTES = 1 << 30
"""The bytes of disk-tier runs kept read (`_run_view`); past it the first read is dropped. A
state's runs beyond it are read again by every look-up that reaches them, so it is sized for
the runs of a worker's state of a few million keys (10^7 keys of 100-byte values over two
workers: about 0.8 GB each)."""
LOG_NOW_BYTES = 256 << 10
"""The largest append `append(log_now=True)` writes on the caller's thread."""


@dataclass
class StoreOptions:
    """Tuning of one store."""

    retention: int = 10_000
    """Versions a read as of `last seq - retention` or later can see survive merges: the
    as-of/rollback window."""
    memory_bytes: int = 1 << 30
    """Memory bound: `append` waits (backpressure, counted in stats) while runs of more bytes
    than this are in memory, not yet indexed on the disk tier."""
    segment_bytes: int = 64 << 20
    """A log segment is sealed (and uploaded) at this size."""
    seal_interval_s: float = 5.0
    """A non-empty log segment older than this is sealed and uploaded."""
    merge_fanout: int = 4
    """This many consecutive runs of a state, each at most this many times another, are merged
    into one (size-tiered levels; compaction.py)."""
    merge_min_bytes: int = 4 << 20
    """Runs that hold less together merge in the background only once they are many (a merge
    has a cost of its own, whatever it merges); `compact` merges them whatever their size."""
    budget: float = 1.0
    """The share of one core merges may take: they spend a credit of CPU seconds that grows by
    `budget` each second (compaction.py). 0 or less: no merges on their own."""
    uploads: bool = False
    """Whether runs go to the remote tier at all (only a store whose tier is remote)."""
    index_entries: bool = True
    """Whether an append's run gets an index entry on the disk tier (`runindex`: its keys hashed
    by the persister, about 180 ns a key), for point readers (`reader`) to index it without
    reading it. A store read only by loads (`load`) has no use for them; a merged run gets its
    entry either way (its own sections, copied)."""
    index_budget: float = 0.02
    """The share of one core the persister may spend making appends' index entries: a credit
    of CPU seconds that grows by it each second (up to 10 s of it); a run whose entry would
    cost more than the credit holds goes without (a reader indexes it from its bytes). At
    2 x 25,000 updates/s an entry costs 0.005 of a core; at ten times that, past the budget,
    a run in two or three gets one."""
    index_delay_s: float = 0.5
    """A logged batch waits up to this long to be indexed in LevelDB, so that the small
    batches logged meanwhile are indexed in one write; batches in memory of `index_bytes` or
    more together, and a caller waiting for indexing, do not wait."""
    index_bytes: int = 1 << 20
    """See `index_delay_s`."""
    on_logged: Any = None
    """Called by the persister, on its thread (or on the appending thread, for an append logged
    there: `Store.append(log_now=True)`), with [(seq, record body)] of the records just
    written to the local log, in seq order (the bytes a replica of the log holds: `seed`
    rebuilds a store from them). It must not block: hand the bytes to another thread."""


PACED_LEVELS = ("remote", "disk")
"""The levels whose background rounds `Store.pace` can hold back."""


@dataclass
class StoreStats:
    """Counters of one store since it was opened: appends, logging, indexing, uploads, backpressure,
    merges and persist errors."""

    appended_runs: int = 0
    appended_updates: int = 0
    appended_bytes: int = 0
    logged_bytes: int = 0
    logged_now: int = 0
    """Appends written to the log on the appending thread (`append(log_now=True)`)."""
    indexed_runs: int = 0
    uploaded_bytes: int = 0
    backpressure_s: float = 0.0
    persist_cpu_s: float = 0.0
    upload_cpu_s: float = 0.0
    """The part of persist_cpu_s that went to the remote tier (uploads, base images)."""
    merges: int = 0
    merged_bytes: int = 0
    files_rewritten: int = 0
    """Times background merges had LevelDB rewrite its files to free removed runs' space."""
    merge_cpu_s: float = 0.0
    versions_dropped: int = 0
    persist_errors: int = 0
    extra: dict = field(default_factory=dict)


class Batch:
    """The runs of one seq, from `append` until LevelDB holds them."""

    __slots__ = ("seq", "runs", "body", "nbytes")

    def __init__(self, seq: int, runs: dict, body: bytes | list[bytes] | None = None) -> None:
        self.seq = seq
        self.runs = runs
        """state (encoded) -> PendingRun, or RunView once read back from the log."""
        self.body = body
        """The log record's body once encoded: msgpack map state -> run bytes (in parts when
        the persister encoded it, `pack_map_parts`)."""
        self.nbytes = sum(r.nbytes for r in runs.values())


class Snapshot:
    """A seq pinned against merges until released: reads as of it stay possible."""

    def __init__(self, store: Store, seq: int) -> None:
        self.store = store
        self.seq = seq
        self._released = False

    def get(self, state: Any, key: Any, default: Any = None) -> Any:
        """The value of `key` in `state` as of the snapshot's seq, or `default`."""
        return self.store.get(state, key, as_of=self.seq, default=default)

    def load(self, state: Any) -> dict:
        """Every live key of `state` and its value as of the snapshot's seq, as a new dict."""
        return self.store.load(state, as_of=self.seq)

    def durable(self, level: str = "disk") -> bool:
        """Whether the snapshot's seq is durable on `level` yet."""
        return self.store.durable(level) >= self.seq

    def wait(self, level: str = "disk", timeout: float | None = None) -> None:
        """Blocks until the snapshot is durable on `level`; raises PersistError on failure."""
        self.store._wait_durable(level, self.seq, timeout)

    def release(self) -> None:
        """Unpins the snapshot's seq, so that merges may drop what only it could see; a second call
        does nothing."""
        if not self._released:
            self._released = True
            self.store._unpin(self.seq)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Updates(NamedTuple):
    """A state's updates for `append`, as its writer holds them.

    - `pairs`: updates logged as they were made, as msgpack chunks, oldest first: (n, a msgpack
      map of n entries in the order they were made, a later entry of a key the newer) each, or
      (n, a msgpack array of n [key, value] pairs); each value None, a bool, an int, a float,
      str or bytes (a container, whose type must come back, goes in the columns);
    - `keys`, `values`: columns, applied after the pairs (TOMBSTONE deletes);
    - `checked`: every key is known to be a store key already (`keys.check_key_column`), and
      is not checked again. REQUIRES: true of the pairs' keys too, whatever `checked` says;
    - `full`: the updates are every live key of the state, not its changes: a key they lack is
      deleted, and a read at or after this seq reads no older run of the state (`run.FULL`).
    """

    keys: list = []
    values: list = []
    pairs: list = []
    checked: bool = False
    full: bool = False


def _seq(column: Any) -> list | tuple:
    """A column as a list or tuple: those as they are (`append` packs them before it returns
    and keeps nothing of them), anything else iterated once."""
    return column if type(column) in (list, tuple) else list(column)


def _columns(updates: Any) -> tuple[list, list]:
    """(keys, values) of what `append` was given for one state: a (keys, values) pair of
    sequences, or a mapping."""
    if isinstance(updates, Mapping):
        return list(updates), list(updates.values())
    if isinstance(updates, tuple) and len(updates) == 2 and not isinstance(updates[0], str | bytes):
        keys, values = updates
        try:
            keys, values = _seq(keys), _seq(values)
        except TypeError:
            raise LsmError(f"a state's (keys, values) pair is not two sequences: {updates!r:.80}") from None
        if len(keys) != len(values):
            raise LsmError(f"{len(keys)} keys and {len(values)} values")
        return keys, values
    raise LsmError(f"a state's updates are a mapping or a (keys, values) pair, not {type(updates).__name__}")


class Store:
    """A log-structured, sequence-numbered, versioned store of named states.

    >>> s = Store("/tmp/state")                                     # doctest: +SKIP
    >>> s.append(1, {"counts": {"a": 1, "b": 2}})                   # doctest: +SKIP
    >>> s.append(2, {"counts": (["a", "b"], [10, TOMBSTONE])})      # doctest: +SKIP
    >>> s.load("counts"), s.get("counts", "a", as_of=1)             # doctest: +SKIP
    ({'a': 10}, 1)
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
        self._lock_fd = files.lock_directory(self.path)
        try:
            self._open(remote)
        except BaseException:
            self._release_handles()
            raise
        self._closed = False
        self._persister = Persister(self)
        self._persister.start()

    # -- opening ----------------------------------------------------------------

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
        self._disk = DiskTier(os.path.join(self.path, "disk"), hash_keys=self.options.index_entries)
        self._log = Log(os.path.join(self.path, "log"), self.options.segment_bytes)
        if fresh and self.remote.files:
            self._restore_from_remote()
        replay = self._log.open(after=self._disk.applied)
        unfinished = self._disk.rollback_marker()
        if unfinished is not None:
            # a crash inside a rollback: finish it
            self._rollback_tiers(unfinished)
            replay = [r for r in replay if r.seq <= unfinished]
        local_last = max(self._log.last_seq, self._disk.applied)
        replay += self._remote_records_after(local_last)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tier_lock = threading.RLock()
        self._pins: dict[int, int] = {}
        self._error: PersistError | None = None
        self._failures = 0
        self._failed_step = 0
        """The persister's step whose failure is `_error` (a wait takes only later ones)."""
        self._batches: list[Batch] = [self._batch_of(rec) for rec in replay]
        self._mem_bytes = sum(b.nbytes for b in self._batches)
        self._logged = self._batches[-1].seq if self._batches else local_last
        self._last = max(local_last, self._logged)
        self._durable_disk = self._last
        self._durable_remote = self.remote.durable()
        self._catalog: dict[bytes, tuple[RunRef, ...]] = {}
        for ref in self._disk.catalog():
            self._catalog[ref.state] = (*self._catalog.get(ref.state, ()), ref)
        self._views: OrderedDict = OrderedDict()
        self._views_bytes = 0
        self._views_lock = threading.Lock()
        self._state_keys: dict[str, bytes] = {}
        self._newest_cache: tuple = (None, {})
        """A state's name, encoded (`get`, many times a name)."""
        self.paced: dict[str, float] = {level: 0.0 for level in PACED_LEVELS}
        """`pace`: the gap each level's rounds keep now."""
        self._gen = 0
        self._view: tuple = ((), {}, None, 0)
        self._publish_locked()

    def _batch_of(self, rec: Record) -> Batch:
        """A batch read back from a log record (logged, not yet indexed)."""
        try:
            body = unpack_keys(rec.packed)
        except Exception as e:  # noqa: BLE001 - msgpack raises several types
            raise CorruptLogError(self.path, rec.offset, f"log record of seq {rec.seq} is not runs: {e}") from e
        runs = {
            bytes(state): RunView(
                bytes(data), f"{self.path}: run of state {decode_key(state)[0]!r} in the log record of seq {rec.seq}"
            )
            for state, data in dict(body).items()
        }
        return Batch(rec.seq, runs, rec.packed)

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
        """Rebuilds an empty local store from the remote tier: the base image's runs go to the
        disk tier, the log segments after it to the local log (replayed like any log)."""
        base = self.remote.base
        if base is not None:
            runs, horizon = self.remote.read_base(base)
            self._disk.write(runs, applied=base.last, sync=True)
            self._disk.set_horizon(horizon)

    # -- writing ------------------------------------------------------------------

    def append(self, seq: int, runs: Mapping[Any, Any], log_now: bool = False) -> int:
        """Gives each state named in `runs` a run at `seq`: its changed keys and their values,
        as a (keys, values) pair of sequences or as a mapping; the value TOMBSTONE deletes its
        key. Later columns win over earlier ones for the same key. Returns the bytes the runs
        take (what the persister writes).

        The keys and values are copied (packed) before it returns; nothing waits on disk,
        except while the memory bound is exceeded (backpressure). Raises SeqOrderError unless
        `seq` is above every seq before it; KeyEncodingError or ValueEncodingError (naming the
        state and key) for what cannot be stored, and nothing is added then.

        With `log_now`, a small append (LOG_NOW_BYTES at most: a lineage point) to a store that
        does not upload is written to the local log on the caller's thread, one durable write,
        when every append before it is logged and no persister step is under way:
        durable("disk") reaches `seq` on return, and the persister is not woken for it (its
        thread would take the GIL from the caller's). Otherwise, and when that write fails,
        the persister logs it as any append (and retries and reports a failure). Threads other
        than the caller that wait for the disk tier may see it up to 50 ms late.
        """
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if type(seq) is not int or seq <= self._last or seq > MAX_SEQ:
            raise SeqOrderError(
                f"append seq {seq!r} to {self.path}: seqs must be ints above the last one ({self._last})"
            )
        if not isinstance(runs, Mapping):
            raise LsmError(f"append seq {seq} to {self.path}: runs are a mapping of states, not {type(runs).__name__}")
        built: dict[bytes, PendingRun] = {}
        for state, updates in runs.items():
            try:
                sb = encode_key(state)
            except KeyEncodingError as e:
                raise KeyEncodingError(f"append seq {seq} to {self.path}: state name: {e}") from None
            if isinstance(updates, Updates):
                built[sb] = self._pending(
                    seq, state, _seq(updates.keys), _seq(updates.values), updates.pairs, updates.checked, updates.full
                )
            else:
                keys, values = _columns(updates)
                built[sb] = self._pending(seq, state, keys, values)
        batch = Batch(seq, built)
        # taken first, so that no persister step begins while the batch is in memory and not
        # yet logged here (it would find nothing to do, and hold this thread up)
        tiers = self._tier_lock if log_now and batch.nbytes <= LOG_NOW_BYTES and not self.options.uploads else None
        if tiers is not None and not tiers.acquire(blocking=False):
            tiers = None  # a step is under way: the batch is the persister's
        try:
            with self._lock:
                now = tiers is not None and self._logged >= self._last and self._error is None
                self._batches.append(batch)
                self._last = seq
                self._mem_bytes += batch.nbytes
                self._publish_locked(disk_changed=False)
                if not now:
                    self._cond.notify_all()
                over = self._mem_bytes > self.options.memory_bytes
            if now and not self._persister.log_now(batch):
                with self._cond:
                    self._cond.notify_all()
        finally:
            if tiers is not None:
                tiers.release()
        st = self.stats
        st.appended_runs += len(built)
        st.appended_updates += sum(r.n + r.npairs for r in built.values())
        st.appended_bytes += batch.nbytes
        if over:
            self._wait_for_memory()
        return batch.nbytes

    def _pending(
        self,
        seq: int,
        state: Any,
        keys: list,
        values: list,
        pairs: list = (),
        checked: bool = False,
        full: bool = False,
    ) -> PendingRun:
        where = f"append seq {seq} to {self.path}, state {state!r}"
        if len(keys) != len(values):
            raise LsmError(f"{where}: {len(keys)} keys and {len(values)} values")
        try:
            if not checked and not check_key_column(keys):
                # lists, at any depth, become the tuples they are as keys
                keys = [k if type(k) in KEY_TYPES else decode_key(encode_key(k))[0] for k in keys]
            keys_b = pack_keys(keys)
        except KeyEncodingError as e:
            raise KeyEncodingError(f"{where}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise KeyEncodingError(f"{where}: {e}") from None
        try:
            values_b, deleted, tuples = pack_column(values)
        except (TypeError, ValueError, OverflowError):
            for k, v in zip(keys, values, strict=True):
                try:
                    pack_values(v)
                except (TypeError, ValueError, OverflowError) as e:
                    raise ValueEncodingError(where, state, k, v, e) from None
            raise
        dels: list[int] = []
        if deleted:
            dels = [i for i, v in enumerate(values) if v is TOMBSTONE]
            last = dict(zip(keys, range(len(keys)), strict=True))
            if len(last) < len(keys):
                dels = [i for i in dels if last[keys[i]] == i]
        npairs, pairs_b = join_pairs(pairs) if pairs else (0, b"")
        run = PendingRun(seq, len(keys), keys_b, values_b, dels, pairs_b, npairs, full, tuples)
        if not npairs and self.options.index_entries:
            run.given = tuple(keys)  # what its index entry hashes, not decoded again
        return run

    def _publish_locked(self, disk_changed: bool = True) -> None:
        """REQUIRES: _lock held (or no other thread yet). Replaces the read view; a LevelDB
        snapshot is taken anew only when the disk tier changed."""
        self._gen += 1
        snap = self._disk.snapshot() if disk_changed or self._view[2] is None else self._view[2]
        self._view = (tuple(self._batches), dict(self._catalog), snap, self._gen)

    def _wait_for_memory(self) -> None:
        start = time.perf_counter()
        since = self._persister.steps
        with self._cond:
            while self._mem_bytes > self.options.memory_bytes and not self._closed:
                if self._failed_step > since and self._fails_level("disk"):
                    raise self._error
                self._cond.wait(0.05)
        self.stats.backpressure_s += time.perf_counter() - start

    # -- reading ------------------------------------------------------------------

    def _check_as_of(self, as_of: int | None) -> int:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if as_of is None:
            return MAX_SEQ
        if type(as_of) is not int:
            raise LsmError(f"as_of must be an int seq or None, not {as_of!r}")
        if as_of < self._disk.horizon:
            raise RetentionError(as_of, self._disk.horizon)
        return as_of

    def _runs(self, sb: bytes, view: tuple, as_of: int, read: bool = True) -> list:
        """The runs of one state that a read as of `as_of` needs, newest first: back to the
        newest that holds every live key (`run.FULL`), or to the first (`read`: as in
        `_iter_runs`)."""
        out = []
        for run in self._iter_runs(sb, view, as_of, read):
            out.append(run)
            if run.full:
                break
        return out

    def _iter_runs(self, sb: bytes, view: tuple, as_of: int, read: bool = True) -> Any:
        """`_runs`, one at a time: a look-up that stops at the first run holding its key reads
        no older one. Without `read`, a run of the disk tier is its RunRef, not read yet."""
        batches, catalog, snap, _ = view
        for b in reversed(batches):
            if b.seq <= as_of and sb in b.runs:
                yield b.runs[sb]
        for ref in reversed(catalog.get(sb, ())):
            if ref.lo <= as_of:
                yield self._run_view(ref, snap) if read else ref

    def _run_view(self, ref: RunRef, snap: object) -> RunView:
        """The run `ref` names, read from the disk tier once and kept (VIEW_CACHE_BYTES in all,
        the first read the first dropped): a reader thread and the API thread may both ask."""
        key = (ref.state, ref.lo, ref.hi)
        v = self._views.get(key)
        if v is not None:
            # kept in the order first read: a look-up moves nothing, and takes no lock
            return v
        data = self._disk.read(ref, snap)
        if data is None:
            raise LsmError(f"store {self.path}: run of seq {ref.hi} is missing from the disk tier")
        v = RunView(data, f"{self.path}: run of state {decode_key(ref.state)[0]!r} at seq {ref.hi}")
        with self._views_lock:
            if key in self._views:  # another thread read it meanwhile
                return self._views[key]
            self._views[key] = v
            self._views_bytes += v.nbytes
            while self._views_bytes > VIEW_CACHE_BYTES and len(self._views) > 1:
                _, old = self._views.popitem(last=False)
                self._views_bytes -= old.nbytes
        return v

    def _drop_views(self, refs: Iterable[RunRef]) -> None:
        """Forgets the views of runs the disk tier no longer holds (a merge replaced them)."""
        with self._views_lock:
            for r in refs:
                v = self._views.pop((r.state, r.lo, r.hi), None)
                if v is not None:
                    self._views_bytes -= v.nbytes

    def get(
        self, state: Any, key: Any, as_of: int | None = None, default: Any = None, max_decode: int | None = None
    ) -> Any:
        """The value of `key` in `state` right after seq `as_of` (None: now), or `default`.

        Raises RetentionError for an `as_of` older than the retention horizon. The returned
        object is the caller's: changing it changes nothing in the store. With `max_decode`,
        raises LookupTooDearError instead of decoding more than that many bytes of a run not
        decoded before (a look-up in a run of millions of keys decodes its value column once,
        which a caller loading the whole state meanwhile would rather wait for).
        """
        view = self._view  # before the horizon check: a merge past as_of publishes after moving it
        if type(as_of) is int and not self._closed and as_of >= self._disk.horizon:
            at = as_of  # the common case, checked inline
        else:
            at = self._check_as_of(as_of)
        if type(key) is not str and type(key) not in KEY_TYPES:
            key = read_key(key, self.path)  # refused as append refuses it; lists as tuples
        h = None  # only a merged run is searched by hash; an append's run is a dict
        if at >= 0:
            cache = self._newest_cache
            runs = cache[1].get(state) if cache[0] is view and type(state) is str else None
            if runs is None:
                runs = self._newest_first(state, view)
            for lo, run, full in runs:
                if lo > at:
                    continue
                if type(run) is not dict:
                    ref = run
                    if type(run) is RunRef:
                        run = self._views.get((run.state, run.lo, run.hi)) or self._run_view(run, view[2])
                    if max_decode is not None and (cost := run.lookup_cost()) > max_decode:
                        raise LookupTooDearError(self.path, cost, max_decode)
                    if run.hashed:
                        if h is None:
                            h = self._key_hash(key)
                        v = run.lookup(key, h, at)
                        if v is MISSING:
                            if full:
                                break  # the run holds every live key: the key is not one
                            continue
                        return default if v is TOMBSTONE else v  # the caller's: `lookup` copies
                    # an append's run (one seq): its latest versions as a dict, kept in place
                    # of the run in this view's list, so that the next look-up finds it at once
                    run = run.latest()
                    runs[[r for _, r, _ in runs].index(ref)] = (lo, run, full)
                v = run.get(key, MISSING)
                if v is not MISSING:
                    if v is TOMBSTONE:
                        return default
                    return v if type(v) in IMMUTABLE_TYPES else own(v)
                if full:
                    break
        # a key the store has not: one append would have refused is refused here
        if h is None:
            self._key_hash(key)
        return default

    def _key_hash(self, key: Any) -> int:
        return read_hash(key, self.path)

    def _newest_first(self, state: Any, view: tuple) -> list:
        """(lo, run, full) of one state's runs in `view`, newest first: a run appended, or the
        RunRef of one on the disk tier (an append's run becomes its dict of latest versions
        once read, `get`). Kept until the view changes (`get`, many times a view); keyed by
        the state's name when it is a str."""
        sb = self._state_keys.get(state) if type(state) is str else None
        if sb is None:
            sb = encode_key(state)
            if type(state) is str and len(self._state_keys) < 1024:
                self._state_keys[state] = sb
        cache = self._newest_cache
        if cache[0] is not view:
            cache = self._newest_cache = (view, {})
        name = state if type(state) is str else sb
        got = cache[1].get(name)
        if got is None:
            batches, catalog, _, _ = view
            got = [(b.seq, b.runs[sb], b.runs[sb].full) for b in reversed(batches) if sb in b.runs]
            got += [(ref.lo, ref, ref.full) for ref in reversed(catalog.get(sb, ()))]
            cache[1][name] = got
        return got

    def reader(self, state: Any, as_of: int) -> PointReader:
        """Point reads of `state` as of seq `as_of` through one index of every run's key hashes
        (`reader.PointReader`): for many look-ups at one seq, in a state of many runs (a
        restore reading keys alone while it loads). Raises RetentionError as `get` does; the
        reader stays a view as of `as_of` whatever merges do meanwhile."""
        view = self._view  # before the horizon check, as in get
        at = self._check_as_of(as_of)
        if at < 0:
            return PointReader([], at, self.path)
        snap = view[2]
        runs: list = []
        for r in self._runs(encode_key(state), view, at, read=False):
            if type(r) is RunRef:
                v = self._views.get((r.state, r.lo, r.hi))
                if v is None and r.hi <= at:
                    # its index entry, not the run: the run is read when a look-up lands in it
                    index = self._disk.read_index(r, snap)
                    if index is not None:
                        runs.append(Stored(r, *index, read=lambda r=r: self._run_view(r, snap)))
                        continue
                r = v if v is not None else self._run_view(r, snap)
            runs.append(r)
        return PointReader(runs, at, self.path)

    def load(self, state: Any, as_of: int | None = None) -> dict:
        """Every live key of `state` and its value right after seq `as_of` (None: now), as a
        new dict: the runs applied oldest first, each by `dict.update` over its columns."""
        out: dict = {}
        for part in self.load_steps(state, as_of):
            out = part
        return out

    def load_steps(self, state: Any, as_of: int | None = None) -> Iterator[dict]:
        """`load`, a part at a time: yields the dict it builds after each run read from the
        disk tier and each part of a run applied (a block of a merged run: `apply_steps`), so
        that its caller can do other work in between; the dict is the state once the iterator
        is done. What it reads is the store as the first part was asked for: appends and merges
        meanwhile change nothing of it."""
        view = self._view  # before the horizon check, as in get
        at = self._check_as_of(as_of)
        out: dict = {}
        if at < 0:
            return
        snap = view[2]
        for run in reversed(self._runs(encode_key(state), view, at, read=False)):
            if type(run) is RunRef:
                run = self._run_view(run, snap)
                yield out
            for _ in run.apply_steps(out, None if at >= run.hi else at):
                yield out
        yield out

    def versions(self, state: Any, key: Any, after: int = -1, upto: int | None = None) -> list[tuple[int, Any]]:
        """(seq, value) of every version of `key` in `state` written in (after, upto], oldest
        first, deletions as TOMBSTONE (for small states: a worker's metadata, its lineage)."""
        view = self._view  # before the horizon check, as in get
        at = self._check_as_of(upto)
        found: dict[int, Any] = {}
        for run in reversed(self._runs(encode_key(state), view, at)):
            if run.hi <= after:
                continue
            keys, values, seqs, _ = run.entries()
            for k, v, s in zip(keys, values, seqs.tolist(), strict=True):
                if after < s <= at and k == key:
                    found[s] = v  # a key twice in one append: the later column is the version
        return sorted(found.items(), key=lambda sv: sv[0])

    def states(self) -> list:
        """The states that have runs, in key order."""
        batches, catalog, _, _ = self._view
        names = set(catalog)
        for b in batches:
            names.update(b.runs)
        return [decode_key(sb)[0] for sb in sorted(names)]

    def runs(self, state: Any) -> list[tuple[int, int, int]]:
        """(lo, hi, entries) of each run of `state`, oldest first: what a load applies."""
        return [(r.lo, r.hi, r.n + r.npairs) for r in reversed(self._runs(encode_key(state), self._view, MAX_SEQ))]

    def image(self) -> Image:
        """A copy of the store as it stands now, with nothing decoded: every run of the disk
        tier as stored (LevelDB reads, so the versions the store keeps stay readable in the
        copy), and every batch not yet indexed as the log record it is (encoded here if the
        persister has not yet). Made from one read view, so merges and appends meanwhile
        change nothing in it. `seed` makes a store of it."""
        with self._lock:
            view, seq = self._view, self._last
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        batches, catalog, snap, _ = view
        rows = []
        for sb, refs in sorted(catalog.items()):
            for ref in refs:
                data = self._disk.read(ref, snap)
                if data is None:
                    raise LsmError(f"store {self.path}: run of seq {ref.hi} is missing from the disk tier")
                rows.append((sb, data))
        records = []
        for b in batches:
            records.append((b.seq, joined(b.body if b.body is not None else pack_map_parts(encoded_runs(b)))))
        applied = batches[0].seq - 1 if batches else seq
        return Image(seq, self._disk.horizon, rows, records, applied)

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

    def pace(self, level: str, gap_s: float) -> None:
        """Lets a level's background rounds fall behind (persistence as resources permit):
        "remote", at least `gap_s` seconds between two uploads; "disk", logged batches wait
        `gap_s` more to be indexed in LevelDB. 0 undoes it. Durability on the local log is
        never paced; a flush of the remote tier and the memory bound still go at once."""
        if level not in PACED_LEVELS:
            raise LsmError(f"store {self.path}: pace {level!r}: only {', '.join(PACED_LEVELS)} can fall behind")
        if not gap_s >= 0:
            raise LsmError(f"store {self.path}: pace {level}: a gap is seconds >= 0, not {gap_s!r}")
        with self._cond:
            self.paced[level] = float(gap_s)
            self._cond.notify_all()

    def persist(self, level: str = "disk") -> int:
        """Starts making everything appended so far durable on `level`, without waiting:
        the caller polls `durable(level)`. Returns the seq it will reach."""
        self.durable(level)
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if level == "remote" and not self.options.uploads:
            raise LsmError(f"store {self.path} was opened with uploads=False: nothing goes to its remote tier")
        with self._cond:
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
        # a step under way when the wait began may fail of a fault cleared since: only a
        # failure of a step begun after it counts
        since = self._persister.steps
        with self._cond:
            while self.durable(level) < seq:
                if self._closed:
                    raise StoreClosedError(f"store {self.path} is closed")
                if self._failed_step > since and self._fails_level(level):
                    raise self._error
                if deadline is not None and time.monotonic() >= deadline:
                    raise LsmError(f"{self.path}: seq {seq} not durable on {level} after {timeout}s")
                self._cond.wait(0.05)

    def snapshot(self) -> Snapshot:
        """The last seq, pinned against merges until released."""
        with self._cond:
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
        """The seq merges may fold up to now: retention, pinned snapshots and what the disk
        tier has indexed all bound it."""
        h = min(self._last - self.options.retention, self._disk.applied)
        if self._pins:
            h = min(h, min(self._pins))
        return max(h, self._disk.horizon)

    # -- rollback, compaction --------------------------------------------------------

    def rollback(self, to_seq: int) -> None:
        """Makes the store exactly what it was right after `to_seq`, on every tier.

        Raises RetentionError if `to_seq` is older than the retention horizon. Crash-safe by an
        intent written first: the disk tier holds "rolling back to `to_seq`" (synced) before any
        tier changes, and an open that finds it finishes the rollback (every step repeats
        harmlessly), so a crash part-way leaves the old state (before the intent) or the new one.
        """
        with self._persister.compactor.lock, self._tier_lock:
            # checked under the compaction lock: a merge may have moved the horizon past
            # to_seq while this call waited for the lock
            self._check_as_of(to_seq)
            if to_seq >= self._last:
                return
            self._disk.begin_rollback(to_seq)
            removed, refs_added = self._rollback_tiers(to_seq)
            with self._cond:
                gone = {(r.state, r.hi) for r in removed}
                cat = {sb: tuple(r for r in refs if (sb, r.hi) not in gone) for sb, refs in self._catalog.items()}
                for ref in refs_added:
                    cat[ref.state] = tuple(sorted((*cat.get(ref.state, ()), ref), key=lambda r: r.hi))
                self._catalog = {sb: refs for sb, refs in cat.items() if refs}
                with self._views_lock:
                    self._views.clear()
                    self._views_bytes = 0
                self._batches = [b for b in self._batches if b.seq <= to_seq]
                self._persister.forget_encoded(to_seq)
                self._last = to_seq
                # what a crash now recovers: the tiers' own last seq at or below to_seq (to_seq
                # itself need not be a seq anything carried); kept batches above it are not logged
                self._logged = max(self._disk.applied, self._log.last_seq)
                carried = self._log.last_seq == to_seq or any(b.seq == to_seq for b in self._batches)
                if to_seq >= 0 and not carried:
                    # no batch carries to_seq: an empty one does, so that last_seq == to_seq
                    # is logged, uploaded and survives a crash like any append
                    self._batches.append(Batch(to_seq, {}))
                    # what is logged ends below it, so that the persister logs it
                    self._logged = min(self._logged, to_seq - 1)
                self._mem_bytes = sum(b.nbytes for b in self._batches)
                self._durable_disk = self._logged
                self._durable_remote = self.remote.durable()
                # a seal asked for above to_seq would outrank every later remote flush below it
                p = self._persister
                p._seal_target = min(p._seal_target, to_seq)
                self._publish_locked()
                self._cond.notify_all()

    def _rollback_tiers(self, to_seq: int) -> tuple[list[RunRef], list[RunRef]]:
        """The tiers' part of a rollback to `to_seq` (its intent durable already): runs above it
        go, a merged run across it is cut back, the remote tier and the log lose what is above
        it, and the intent is cleared. Returns the runs removed and added. REQUIRES: tier lock
        held (or no other thread yet: an open finishing a rollback)."""
        removed: list[RunRef] = []
        added: list[tuple[bytes, bytes]] = []
        by_state: dict[bytes, list[RunRef]] = {}
        for ref in self._disk.catalog():
            by_state.setdefault(ref.state, []).append(ref)
        for sb, refs in by_state.items():
            for i, ref in enumerate(refs):
                if ref.hi <= to_seq:
                    continue
                removed.append(ref)
                if ref.lo <= to_seq:
                    view = RunView(self._disk.read(ref), f"{self.path}: run of seq {ref.hi}")
                    added.append((sb, truncate(view, to_seq, self._disk.horizon, base=i == 0)))
        refs_added = self._disk.write(added, removed, applied=min(self._disk.applied, to_seq), sync=True)
        self.remote.drop_after(to_seq)
        self._log.truncate_after(to_seq)
        if self._disk.standin > to_seq:
            self._disk.set_standin(-1)  # its record is gone with the seqs above to_seq
        if to_seq >= 0 and self._disk.applied == to_seq and self._log.last_seq != to_seq:
            # LevelDB says to_seq now (it had indexed past it), so a crash recovers to_seq:
            # the log must hold a record of it, or the remote tier could never reach it
            # (nothing at or below to_seq waits to be logged: an empty record carries it).
            # The runs of to_seq, if any, are LevelDB's alone: marked first, so that the
            # remote tier gets them from a base image, never from this empty record
            self._disk.set_standin(to_seq)
            self._log.append([(to_seq, pack_keys({}))])
        self._disk.end_rollback()
        return removed, refs_added

    def compact(self) -> dict:
        """Indexes everything, then merges every state's runs as far as retention allows and
        has LevelDB rewrite its files. Returns what it did."""
        if self.options.uploads:
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

        A clean close also indexes every batch in LevelDB and has LevelDB write its own
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
        self._view = ((), {}, None, self._gen)
        self._views.clear()
        self._views_bytes = 0
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

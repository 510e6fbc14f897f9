"""The persister: the store's background half, moving frozen memtables down the tiers.

One step at a time, each under the store's tier lock, in this order of priority:

1. log: write every frozen memtable not yet logged to the local log, one write + fsync for
   all of them; `durable("disk")` advances;
2. index: put the oldest logged memtable's updates into LevelDB, then drop it from memory
   (this is what frees the memory bound);
3. upload: seal the current log segment when it is full, old, or a flush asks, and upload the
   sealed records the remote tier lacks; `durable("remote")` advances;
4. compact: after `compact_every_updates` indexed updates, hand compaction to its thread.

The API thread never waits for a step, only for durability it asked for (flush, snapshot
wait) or for memory under the bound. A failing step (ENOSPC, EIO, an unreachable remote) is
recorded as the store's `error`, counted, and retried with backoff; the memtables it was
writing stay in memory, so nothing is lost, and the next successful step clears the error.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from lsm.compaction import Compactor
from lsm.errors import PersistError

if TYPE_CHECKING:
    from lsm.store import Store

MAX_BACKOFF_S = 1.0


class Persister(threading.Thread):
    def __init__(self, store: Store) -> None:
        super().__init__(name=f"lsm-persister:{store.path}", daemon=True)
        self.s = store
        self._stopping = False
        self._backoff = 0.0
        self._indexed_since_compact = 0
        self._seal_target = -1
        self.compactor = Compactor(store)

    # -- the loop ---------------------------------------------------------------

    def run(self) -> None:
        s = self.s
        while True:
            with s._cond:
                while not self._stopping:
                    self._freeze_by_age_locked()
                    if self._due_locked():
                        break
                    s._cond.wait(self._tick())
                if self._stopping:
                    return
            level = "disk"
            try:
                with s._tier_lock:
                    level = self._step()
            except Exception as e:  # noqa: BLE001 - the thread must not die: the error surfaces to callers
                self._fail(level, e)
                continue
            if s._error is not None:
                with s._cond:
                    s._error = None
            self._backoff = 0.0

    def _tick(self) -> float:
        o = self.s.options
        return max(0.005, min(o.flush_interval_s, o.seal_interval_s) / 2)

    def _freeze_by_age_locked(self) -> None:
        s = self.s
        m = s._active
        if m.batches and time.monotonic() - m.created >= s.options.flush_interval_s:
            s._freeze_locked()

    def _due_locked(self) -> bool:
        s = self.s
        if s._frozen:
            return True
        if self._upload_due():
            return True
        return self._compaction_due()

    def _compaction_due(self) -> bool:
        every = self.s.options.compact_every_updates
        return bool(every) and self._indexed_since_compact >= every and not self.compactor.busy

    def _upload_due(self) -> bool:
        log = self.s._log
        if not log.segments or not self.s.options.uploads:
            return False
        if any(seg.sealed and seg.last > self.s._durable_remote for seg in log.segments[-2:]):
            return True
        return self._current_due()

    def _fail(self, level: str, e: BaseException) -> None:
        s = self.s
        err = e if isinstance(e, PersistError) else PersistError(level, s.path, e)
        with s._cond:
            s._error = err
            s._failures += 1
            s.stats.persist_errors += 1
            s._cond.notify_all()
            self._backoff = min(MAX_BACKOFF_S, (self._backoff or 0.005) * 2)
            if not self._stopping:
                s._cond.wait(self._backoff)

    # -- steps --------------------------------------------------------------------

    def _step(self) -> str:
        """One unit of work; returns the level it wrote (for error reports)."""
        s = self.s
        with s._cond:
            pending = [b for m in s._frozen for b in m.batches if b[0] > s._logged]
            oldest = s._frozen[0] if s._frozen else None
        if pending:
            self._log_batches(pending)
            return "disk"
        if oldest is not None and oldest.last <= s._logged:
            self._index(oldest)
            return "disk"
        if self._upload_due():
            try:
                self._upload()
            except Exception as e:  # noqa: BLE001
                # The caller cannot see this step's return value: name the level here.
                raise PersistError("remote", s.path, e) from e
            return "remote"
        if self._compaction_due():
            self._indexed_since_compact = 0
            self.compactor.request()
        return "disk"

    def _log_batches(self, batches: list[tuple[int, bytes]]) -> None:
        s = self.s
        s._log.append(batches)
        with s._cond:
            s._logged = batches[-1][0]
            s._durable_disk = max(s._durable_disk, s._logged)
            s.stats.logged_bytes += sum(len(p) for _, p in batches)
            s._cond.notify_all()

    def _index(self, m) -> None:
        s = self.s
        batches = [b for b in m.batches if b[0] > s._disk.applied]
        if batches:
            s._disk.apply(batches)
        with s._cond:
            if s._frozen and s._frozen[0] is m:
                s._frozen.pop(0)
                s._mem_updates -= m.updates
            s._gen += 1
            s._publish_locked()
            s.stats.indexed_updates += m.updates
            s._cond.notify_all()
        self._indexed_since_compact += m.updates

    def _current_due(self) -> bool:
        """Whether the segment being written should be sealed now (full, old, or asked for)."""
        s = self.s
        seg = s._log.segments[-1]
        if seg.sealed or seg.last < seg.first:
            return False
        if self._seal_target > s._durable_remote and s._logged >= self._seal_target:
            return True
        return seg.size >= s.options.segment_bytes or time.monotonic() - seg.created >= s.options.seal_interval_s

    def _upload(self) -> None:
        s = self.s
        log = s._log
        if self._current_due():
            log.seal()
        start = s._durable_remote
        records = []
        for seg in log.segments:
            if seg.sealed and seg.last > start:
                got = log.read(seg)
                # a sealed segment holds what it holds: a bound open() estimated is made exact,
                # so that a segment never looks like it has something left to upload
                seg.last = got[-1].seq if got else seg.first - 1
                records.extend(r for r in got if r.seq > start)
        if records:
            s.remote.upload(start + 1, records)
        with s._cond:
            s._durable_remote = s.remote.durable()
            s.stats.uploaded_bytes += sum(len(r.packed) for r in records)
            s._cond.notify_all()
        log.drop_through(min(s._durable_remote, s._disk.horizon, s._disk.applied))

    # -- requests from the API thread -----------------------------------------------

    def request_seal(self, target: int) -> None:
        """REQUIRES: store._lock held."""
        self._seal_target = max(self._seal_target, target)

    def drain_index(self) -> None:
        """Waits until every frozen memtable is indexed on the disk tier."""
        s = self.s
        with s._cond:
            s._freeze_locked()
            while s._frozen:
                if s._error is not None:
                    raise s._error
                s._cond.wait(0.05)

    def compact(self, full: bool) -> dict:
        return self.compactor.run(full)

    def stop(self) -> None:
        s = self.s
        with s._cond:
            self._stopping = True
            s._cond.notify_all()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()
        self.compactor.stop()

"""The persister: the store's background half, moving appended runs down the tiers.

One step at a time, each under the store's tier lock, in this order of priority:

1. encode and log: every batch not yet logged is encoded (its runs' hash columns computed and
   sorted, its keys packed) and written to the local log, one durable write for all of them;
   `durable("disk")` advances;
2. index: put the logged batches' runs into LevelDB, one write batch, then drop them from
   memory (this is what frees the memory bound). Small batches wait (`index_delay_s`) to be
   indexed together: a store appended to every few milliseconds would otherwise write
   LevelDB, take a LevelDB snapshot and wake the compactor as often;
3. upload: seal the current log segment when it is full, old, or a flush asks, and upload the
   sealed records the remote tier lacks; `durable("remote")` advances (only with uploads);
4. merge: hand merges to the compactor's thread when a state's runs call for one.

The API thread never waits for a step, only for durability it asked for (flush, snapshot
wait) or for memory under the bound. A failing step (ENOSPC, EIO, an unreachable remote) is
recorded as the store's `error`, counted, and retried with backoff; the runs it was writing
stay in memory, so nothing is lost, and the next successful step clears the error.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

from lsm import runindex
from lsm.codec import joined, pack_map_parts
from lsm.compaction import Compactor
from lsm.errors import PersistError
from lsm.run import HASHED, HEADER, PendingRun

if TYPE_CHECKING:
    from lsm.store import Batch, Store

MAX_BACKOFF_S = 1.0


def encoded_runs(batch: Batch) -> dict[bytes, bytes]:
    """The bytes of each run of a batch (encoding the ones appended here)."""
    return {sb: r.encode() if isinstance(r, PendingRun) else r.data for sb, r in batch.runs.items()}


class Persister(threading.Thread):
    """The store's background thread: logs, indexes and uploads the appended runs, one step at a
    time, and hands merges to its compactor."""

    def __init__(self, store: Store) -> None:
        super().__init__(name=f"lsm-persister:{store.path}", daemon=True)
        self.s = store
        self._stopping = False
        self._backoff = 0.0
        self._seal_target = -1
        self.steps = 0
        """Steps begun: a wait fails only on an error of a step begun after it (`Store`)."""
        self._index_wanted = 0
        """Callers waiting for every batch to be indexed (`drain_index`)."""
        self._logged_since: float | None = None
        """When the oldest logged batch not yet indexed was logged."""
        self._uploaded_at = -math.inf
        """When the last upload ended (`Store.pace("remote")` counts from it)."""
        self._encoded: dict[int, dict[bytes, bytes]] = {}
        """seq -> its runs' bytes, from encoding until indexing."""
        self._entries: dict[int, tuple[dict, dict[bytes, bytes | None]]] = {}
        """seq -> (its runs' bytes, their index entries), made outside the tier lock."""
        self._entry_credit = 10 * store.options.index_budget
        """CPU seconds index entries may take now (`StoreOptions.index_budget`), full at first."""
        self._entry_credit_at = time.monotonic()
        self._entry_key_s = 2e-7
        """CPU seconds an entry took per key (measured; a guess until then)."""
        self.compactor = Compactor(store)

    # -- the loop ---------------------------------------------------------------

    def run(self) -> None:
        """The thread's loop: waits until a step is due and takes it under the tier lock; a failing
        step becomes the store's error and is retried with backoff."""
        s = self.s
        while True:
            with s._cond:
                while not self._stopping:
                    if self._due_locked():
                        break
                    s._cond.wait(self._wait_s())
                if self._stopping:
                    return
            level = "disk"
            t0 = time.thread_time()
            self.steps += 1
            step = self.steps
            try:
                self._make_index_entries()
                with s._tier_lock:
                    level = self._step()
            except Exception as e:  # noqa: BLE001 - the thread must not die: the error surfaces to callers
                self._fail(level, e, step)
                continue
            finally:
                spent = time.thread_time() - t0
                s.stats.persist_cpu_s += spent
                if level == "remote":
                    s.stats.upload_cpu_s += spent
            if s._error is not None:
                with s._cond:
                    s._error = None
            self._backoff = 0.0

    def _tick(self) -> float:
        return max(0.005, self.s.options.seal_interval_s / 2)

    def _wait_s(self) -> float:
        """How long the loop may sleep: until the next periodic check, or until logged batches
        are due to be indexed."""
        tick = self._tick()
        if self.s._batches and self._logged_since is not None:
            left = self._logged_since + self._index_delay() - time.monotonic()
            return max(0.001, min(tick, left))
        return tick

    def _index_due_locked(self) -> bool:
        """Whether the logged batches in memory are to be indexed now."""
        s = self.s
        if not s._batches:
            return False
        if self._index_wanted or s._mem_bytes >= min(s.options.index_bytes, s.options.memory_bytes):
            return True
        since = self._logged_since
        return since is None or time.monotonic() - since >= self._index_delay()

    def _index_delay(self) -> float:
        return self.s.options.index_delay_s + self.s.paced["disk"]

    def _due_locked(self) -> bool:
        s = self.s
        if s._batches and (s._batches[-1].seq > s._logged or self._index_due_locked()):
            return True
        if self._upload_due():
            return True
        return self.compactor.due()

    def _upload_due(self) -> bool:
        s = self.s
        log = s._log
        if not s.options.uploads:
            return False
        if self._gap() is not None:
            return True
        if not log.segments:
            return False
        gap = s.paced["remote"]
        if gap and self._seal_target <= s._durable_remote and time.monotonic() - self._uploaded_at < gap:
            return False  # held back by `pace`, and no flush asks for the remote tier
        if any(seg.sealed and seg.last > s._durable_remote for seg in log.segments[-2:]):
            return True
        return self._current_due()

    def _gap(self) -> int | None:
        """The seq up to which the remote tier needs a base image before any log segment can
        extend it: seqs were indexed and their log segments deleted while the store did not
        upload, so the local log no longer holds the seqs just above what the remote tier
        holds. None: no gap (seqs need not be consecutive: a gap is a run's seq missing)."""
        s = self.s
        held = s._durable_remote
        if held >= s._disk.applied:
            return None
        if s._disk.standin > held:
            # the log's record of that seq stands in for runs only LevelDB holds (a rollback)
            return s._disk.applied
        first = next((seg.first for seg in s._log.segments if seg.last >= seg.first), s._disk.applied + 1)
        if first <= held + 1:
            return None
        if not any(ref.lo < first and ref.hi > held for refs in s._catalog.values() for ref in refs):
            return None
        return min(first - 1, s._disk.applied)

    def _fail(self, level: str, e: BaseException, step: int) -> None:
        s = self.s
        err = e if isinstance(e, PersistError) else PersistError(level, s.path, e)
        with s._cond:
            s._error = err
            s._failures += 1
            s._failed_step = step
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
            batches = list(s._batches)
            logged = s._logged
            index = self._index_due_locked()
        unlogged = [b for b in batches if b.seq > logged]
        if unlogged:
            self._log_batches(unlogged)
            return "disk"
        if batches and index:
            self._index(batches)
            return "disk"
        if self._upload_due():
            try:
                self._upload()
            except Exception as e:  # noqa: BLE001
                # the caller cannot see this step's return value: name the level here
                raise PersistError("remote", s.path, e) from e
            return "remote"
        if self.compactor.due():
            self.compactor.request()
        return "disk"

    def _log_batches(self, batches: list[Batch], wake: bool = True) -> None:
        """Writes `batches` to the local log, one durable write. REQUIRES: tier lock held. Without
        `wake`, waiters are told only when the first batch waiting to be indexed was logged
        (the loop then sleeps until it is due)."""
        s = self.s
        records = []
        for b in batches:
            runs = self._encoded.get(b.seq)
            if runs is None:
                runs = self._encoded[b.seq] = encoded_runs(b)
            if b.body is None:
                b.body = pack_map_parts(runs)
            records.append((b.seq, b.body))
        s._log.append(records)
        tell = s.options.on_logged
        if tell is not None:
            tell([(seq, joined(body)) for seq, body in records])
        with s._cond:
            s._logged = max(s._logged, batches[-1].seq)
            s._durable_disk = max(s._durable_disk, s._logged)
            first = self._logged_since is None
            if first:
                self._logged_since = time.monotonic()
            s.stats.logged_bytes += sum(len(p) for _, p in records)
            if wake or first or self._index_due_locked():
                s._cond.notify_all()

    def _index(self, batches: list[Batch]) -> None:
        """Puts the runs of logged batches into LevelDB (one write batch), then lets them go."""
        s = self.s
        added = []
        for b in batches:
            runs = self._encoded.pop(b.seq, None)
            made = self._entries.pop(b.seq, None)
            if runs is None:
                runs = encoded_runs(b)
            entries = made[1] if made is not None and made[0] is runs else {}
            # a run whose entry was not made beforehand gets it from the disk tier's write
            added.extend((sb, data, entries[sb]) if sb in entries else (sb, data) for sb, data in runs.items())
        last = batches[-1].seq
        refs = s._disk.write(added, applied=last) if last > s._disk.applied else []
        with s._cond:
            for ref in refs:
                s._catalog[ref.state] = (*s._catalog.get(ref.state, ()), ref)
            done = {id(b) for b in batches}
            s._batches = [b for b in s._batches if id(b) not in done]
            s._mem_bytes = sum(b.nbytes for b in s._batches)
            self._logged_since = time.monotonic() if s._batches and s._batches[0].seq <= s._logged else None
            s._publish_locked()
            s.stats.indexed_runs += len(refs)
            s._cond.notify_all()
        self.compactor.indexed(refs)

    def _make_index_entries(self) -> None:
        """Makes the index entries (`runindex`) of the runs logged and not indexed yet, outside
        the tier lock: hashing a big run's keys does not hold up a small append that waits
        for the lock to be logged at once (`Store.append`). An entry is used only with the
        bytes it was made from (a rollback may drop them meanwhile, and a seq be appended
        again)."""
        if not self.s.options.index_entries:
            return
        with self.s._cond:
            batches = {b.seq: b for b in self.s._batches}
        for seq, runs in list(self._encoded.items()):
            made = self._entries.get(seq)
            if made is None or made[0] is not runs:
                b = batches.get(seq)
                pending = b.runs if b is not None else {}
                entries = {}
                for sb, data in runs.items():
                    r = pending.get(sb)
                    given = r.given if isinstance(r, PendingRun) else None
                    entries[sb] = self._entry(data, given)
                    if given is not None:
                        r.given = None
                self._entries[seq] = (runs, entries)

    def _entry(self, data: bytes, given: tuple | None) -> bytes | None:
        """The index entry of run `data`, if the credit of `index_budget` holds its cost (a
        merged run's costs a copy); None otherwise."""
        head = HEADER.unpack_from(data, 0)
        if head[2] & HASHED:
            return runindex.of_run(data)
        n = head[5]
        now = time.monotonic()
        budget = self.s.options.index_budget
        self._entry_credit = min(self._entry_credit + budget * (now - self._entry_credit_at), 10 * budget)
        self._entry_credit_at = now
        if budget < 1 and n * self._entry_key_s > self._entry_credit:
            return None
        t0 = time.thread_time()
        entry = runindex.of_run(data, given)
        spent = time.thread_time() - t0
        self._entry_credit -= spent
        if n >= 10_000:
            self._entry_key_s = 0.5 * self._entry_key_s + 0.5 * spent / n
        return entry

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
        gap = self._gap()
        if gap is not None:
            # everything up to `gap` is indexed: a base image of it makes the tier whole; it
            # keeps the versions the retention horizon keeps, so that a restore from the
            # remote tier can read as far back as the store it replaces
            self.compactor.write_base(gap, min(gap, s._disk.horizon))
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
            # before the durable point moves: a caller that saw it move sees the upload's time
            self._uploaded_at = time.monotonic()
            s._durable_remote = s.remote.durable()
            s.stats.uploaded_bytes += sum(len(r.packed) for r in records)
            s._cond.notify_all()
        self.drop_log()

    def drop_log(self) -> None:
        """Deletes the local log segments nothing needs any more: indexed, and uploaded when
        the store uploads. REQUIRES: tier lock held."""
        s = self.s
        upto = s._disk.applied
        if s.options.uploads:
            upto = min(upto, s._durable_remote)
        s._log.drop_through(upto)
        standin = s._disk.standin
        if standin >= 0 and all(seg.first > standin for seg in s._log.segments):
            s._disk.set_standin(-1)  # the empty record is gone: nothing can upload it any more

    # -- requests from the API thread -----------------------------------------------

    def log_now(self, batch: Batch) -> bool:
        """Logs `batch`, the only batch not yet logged, on the caller's thread
        (`Store.append(log_now=True)`). Returns whether it did; a write that fails is left to
        the loop, which retries it and reports the error. REQUIRES: tier lock held."""
        s = self.s
        t0 = time.thread_time()
        try:
            self._log_batches([batch], wake=False)
        except Exception:  # noqa: BLE001 - the loop logs it again, and reports what fails
            return False
        finally:
            s.stats.persist_cpu_s += time.thread_time() - t0
        s.stats.logged_now += 1
        return True

    def request_seal(self, target: int) -> None:
        """REQUIRES: store._lock held."""
        self._seal_target = max(self._seal_target, target)

    def drain_index(self) -> None:
        """Waits until every appended batch is indexed on the disk tier."""
        s = self.s
        with s._cond:
            self._index_wanted += 1
            try:
                while s._batches:
                    if s._fails_level("disk"):  # a remote outage does not stop indexing
                        raise s._error
                    s._cond.notify_all()
                    s._cond.wait(0.05)
            finally:
                self._index_wanted -= 1

    def forget_encoded(self, above: int) -> None:
        """Drops the encodings of batches above `above` (a rollback dropped them)."""
        for seq in [q for q in self._encoded if q > above]:
            del self._encoded[seq]
        # made outside the tier lock meanwhile: copied before it is walked
        for seq in [q for q in list(self._entries) if q > above]:
            self._entries.pop(seq, None)

    def stop(self) -> None:
        """Stops the thread after its current step, waits for it (unless this is it), then stops the
        merges."""
        s = self.s
        with s._cond:
            self._stopping = True
            s._cond.notify_all()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()
        self.compactor.stop()

"""Merges: the LSM levels, and what the retention window no longer needs.

Each `append` gives a state one small run (level 0). A load applies every run of the state, so
runs are merged, in the background and as resources permit, into fewer, bigger ones:

- size-tiered: a state's runs fall into tiers, consecutive runs each at most `merge_fanout`
  times another (none older than a run of every live key); a tier of `merge_fanout` runs
  that hold `merge_min_bytes` (or of MANY_RUNS) merges its oldest `merge_fanout` into one, so
  that a merge's cost does not grow with the runs waiting. The merged run keeps every version
  a read at or after the retention horizon can see (its history block), and its latest block
  is what a load applies;
- retention: the runs entirely at or below the horizon h = min(last seq - retention, pinned
  snapshots, what is indexed) merge by the same tiers into runs that keep no version a read at
  or after h cannot see (the oldest of them, the base, no deletion either); the runs older
  than the newest run of every live key at or below h are deleted without a merge (the
  horizon is made durable first, so a read below it is refused before any version goes).
  `compact()` folds all of them into one base run, and merges each tier above h whole;
- with uploads, a base image of every state at h goes to the remote tier, and the remote log
  segments it makes redundant are deleted; local log segments that are indexed (and uploaded)
  are deleted;
- space: once the runs merges removed reach COMPACT_AFTER_BYTES and the size of the runs
  still live, LevelDB is asked to rewrite its files (outside the GIL), which frees them: it
  would otherwise keep a removed run's bytes until its own compactions reached them.

Merges run on a thread of their own, beside the persister: LevelDB takes concurrent writers,
and a merge replaces its runs in one write batch. They take at most `budget` of a core by a
credit of CPU seconds: it grows by `budget` each second, up to the estimated cost of the
merges called for; a merge starts only when the credit holds its estimated cost, and
spends what it took. A big merge therefore waits its cost / budget seconds, and the small merges
that run meanwhile delay it only by what they spend: they cannot starve it. Rollback takes `lock`
to keep merges out while it rewrites history.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from lsm.disk import RunRef
from lsm.errors import PersistError
from lsm.keys import decode_key
from lsm.memory import release_free_memory
from lsm.run import RunView, image, merge

if TYPE_CHECKING:
    from lsm.store import Store


COMPACT_AFTER_BYTES = 256 << 20
"""Bytes of removed runs after which background merges have LevelDB rewrite its files (once the
removed bytes also reach the runs still live): LevelDB frees a deleted value's space only when
its own compactions reach the value's file, which under a steady stream of large runs can be
never, so that the tier grows without bound however well the runs are merged."""

TRIM_EVERY_S = 1.0
"""The C heap's free pages go back to the OS after merges at most this often
(`memory.release_free_memory`)."""

MANY_RUNS = 64
"""Runs smaller together than `merge_min_bytes` (a worker's metadata, its lineage points) merge
in the background only once they are this many: a merge costs a few milliseconds whatever it
merges, and their reads are rare."""


def _tiers(refs: list, fanout: int, least: int, whole: bool = False) -> list[list]:
    """The merges `refs` call for, each a list of consecutive runs, oldest first. From the
    newest, the runs fall into tiers: consecutive runs each at most `fanout` times another
    (a run under `least / fanout` bytes counting as that size: small runs of uneven sizes are
    one tier, so that they are ever many), none with a run older than one that holds every
    live key. A tier worth a merge (`_enough`)
    gives its oldest runs until `fanout` of them hold `least` bytes: a merge's cost stays
    bounded however many runs wait, and the runs it leaves are the newest of their tier, so
    none is stranded under the merged run. With `whole`, a tier is merged whole."""
    tiers: list[list] = []
    group: list = []
    smallest = largest = 0
    floor = max(1, least // fanout)
    for r in reversed(refs):
        size = max(floor, r.nbytes)
        if group and (group[-1].full or size > fanout * smallest or largest > fanout * size):
            tiers.append(group)
            group = []
        smallest, largest = (min(smallest, size), max(largest, size)) if group else (size, size)
        group.append(r)
    tiers.append(group)
    out = []
    for group in tiers:
        group.reverse()
        nbytes = 0
        for i, r in enumerate(group):
            nbytes += r.nbytes
            if not whole and i + 1 >= fanout and nbytes >= least:
                group = group[: i + 1]
                break
        if _enough(group, fanout, least):
            out.append(group)
    return out


def _kept_as_is(refs: list) -> bool:
    """Whether a merge of `refs` leaves them as they are: a single run with no older version or
    deletion to fold."""
    return len(refs) == 1 and not (refs[0].nhist or refs[0].ndel)


def _enough(group: list, fanout: int, least: int) -> bool:
    """Whether `group` is worth a merge: `fanout` runs or more holding `least` bytes, or
    MANY_RUNS."""
    return len(group) >= fanout and (sum(r.nbytes for r in group) >= least or len(group) >= MANY_RUNS)


class Compactor:
    """The merges of one store: when its states' runs call for one, it runs them on a thread of its
    own, spending a credit that holds them to `budget` of a core."""

    def __init__(self, store: Store) -> None:
        self.s = store
        self.lock = threading.Lock()
        self.busy = False
        self._thread: threading.Thread | None = None
        self._credit_s = 0.0
        """CPU seconds merges may spend now (negative after a merge took more than estimated)."""
        self._credit_at = time.monotonic()
        self._entry_cpu_s = 2e-6
        """CPU seconds a merge took per entry it merged (measured; a guess until then)."""
        self._stopping = False
        self.last_report: dict = {}
        self.removed_bytes = 0
        """Bytes of runs removed since LevelDB last rewrote its files."""
        self._trimmed_at = 0.0

    # -- when -------------------------------------------------------------------

    def _plans(self, horizon: int, full: bool = False) -> list[tuple[bytes, list, bool, bool, list]]:
        """The merges the catalog calls for (`full`: every state's runs at or below the horizon
        folded, and the others whatever their size): (state, runs, base, fold, dropped: older
        runs that go without being merged) each."""
        s = self.s
        fanout = max(2, s.options.merge_fanout)
        least = 0 if full else s.options.merge_min_bytes
        out = []
        for sb, refs in s._catalog.items():
            old = [r for r in refs if r.hi <= horizon]
            # the runs at or below the horizon older than the newest of them that holds every
            # live key (`run.FULL`) are read by nothing any more: they go with the merge
            # (dropped alone: the runs after it merge by the rules below)
            cut = max((i for i, r in enumerate(old) if r.full), default=0)
            if cut:
                out.append((sb, old[cut : cut + 1], True, True, old[:cut]))
                continue
            # `compact()` folds them all; a lone one is folded for the versions and deletions it
            # no longer needs
            if (full and len(old) >= 2) or (len(old) == 1 and not _kept_as_is(old)):
                out.append((sb, old, True, True, []))
                continue
            # size-tiered below the horizon too: folding every new run into the base would
            # rewrite the whole state at each merge, a cost that grows with the state
            for group in _tiers(old, fanout, least, full):
                out.append((sb, group, group[0] is refs[0], True, []))
            for group in _tiers(refs[len(old) :], fanout, least, full):
                out.append((sb, group, group[0] is refs[0], False, []))
        return out

    def due(self) -> bool:
        """Whether a merge is called for and may start now. REQUIRES: store._lock held."""
        s = self.s
        if self.busy or self._stopping or s.options.budget <= 0:
            return False
        return bool(self._affordable(self._plans(s.compaction_horizon())))

    def _affordable(self, plans: list) -> list:
        """The merges the credit allows now, in order, each by its cost estimated from the
        entries it merges and what an entry cost the merges before. The credit grows by
        `budget` per second up to what `plans` cost together, so that a big merge waits its cost /
        budget seconds before it starts, not only after: it never takes a core for seconds out
        of a short span of work. REQUIRES: store._lock held."""
        budget = self.s.options.budget
        if budget >= 1:
            return plans
        now = time.monotonic()
        costs = [self._estimate(p[1]) for p in plans]
        self._credit_s = min(self._credit_s + budget * (now - self._credit_at), sum(costs))
        self._credit_at = now
        left = self._credit_s
        out = []
        for p, cost in zip(plans, costs, strict=True):
            if cost <= left:
                out.append(p)
                left -= cost
        return out

    def _estimate(self, refs: list) -> float:
        if _kept_as_is(refs):
            return 0.0  # nothing merged: older runs dropped
        return sum(r.n + r.npairs + r.nhist for r in refs) * self._entry_cpu_s

    def indexed(self, refs: list[RunRef]) -> None:
        """The persister indexed new runs (nothing to do but to be asked again)."""

    def request(self) -> None:
        """Starts background merges unless they are running."""
        if self.busy:
            return
        self.busy = True
        self._thread = threading.Thread(target=self._background, name=f"lsm-compactor:{self.s.path}", daemon=True)
        self._thread.start()

    def _background(self) -> None:
        s = self.s
        try:
            self.run(full=False, paced=True)
        except Exception as e:  # noqa: BLE001 - reported as the store's error, retried later
            with s._cond:
                s._error = e if isinstance(e, PersistError) else PersistError("disk", s.path, e)
                s._failures += 1
                s._failed_step = s._persister.steps + 1
                s._cond.notify_all()
        finally:
            self.busy = False
            with s._cond:
                s._cond.notify_all()

    # -- what -------------------------------------------------------------------

    def run(self, full: bool, paced: bool = False) -> dict:
        """The merges the runs call for now (with `full`, every state's runs at or below the
        horizon folded, and LevelDB's files rewritten; with `paced`, only those the budget
        allows now); returns what it did."""
        s = self.s
        with self.lock:
            start = time.perf_counter()
            t0 = time.thread_time()
            h = s.compaction_horizon()
            report = {"horizon": h, "merges": 0, "merged_bytes": 0, "base_image": None, "log_bytes_freed": 0}
            if h > s._disk.horizon:
                s._disk.set_horizon(h)
            with s._cond:
                plans = self._plans(h, full)
                if paced:
                    plans = self._affordable(plans)
            for sb, refs, base, fold, dropped in plans:
                if self._stopping:
                    break
                t1 = time.thread_time()
                self._merge(sb, refs, h if fold else s._disk.horizon, base, report, dropped)
                entries = sum(r.n + r.npairs + r.nhist for r in refs)
                cpu = time.thread_time() - t1
                if entries >= 10_000:
                    self._entry_cpu_s = 0.5 * self._entry_cpu_s + 0.5 * cpu / entries
                if paced:
                    with s._cond:
                        self._credit_s -= cpu
            if full or self._space_to_free():
                s._disk.compact_files()
                self.removed_bytes = 0
                s.stats.files_rewritten += 1
            if s.options.uploads:
                self._base_image(h, full, report)
            with s._tier_lock:
                before = s._log.disk_bytes()
                seg = s._log.segments[-1] if s._log.segments else None
                if full and seg is not None and not seg.sealed and seg.last <= s._disk.applied:
                    # everything the open segment holds is indexed: sealed, it goes now (after
                    # its upload, with uploads) rather than once it fills
                    s._log.seal()
                s._persister.drop_log()
                report["log_bytes_freed"] = before - s._log.disk_bytes()
            if report["merges"] and time.monotonic() - self._trimmed_at >= TRIM_EVERY_S:
                release_free_memory()  # what the merges freed, back to the OS
                self._trimmed_at = time.monotonic()
            s.stats.merge_cpu_s += time.thread_time() - t0
            report["seconds"] = time.perf_counter() - start
            self.last_report = report
            return report

    def _space_to_free(self) -> bool:
        """Whether the runs removed since LevelDB last rewrote its files are COMPACT_AFTER_BYTES
        or more, and as many bytes as the runs still live (the rewrite costs about those)."""
        if self.removed_bytes < COMPACT_AFTER_BYTES:
            return False
        with self.s._cond:
            live = sum(r.nbytes for refs in self.s._catalog.values() for r in refs)
        return self.removed_bytes >= live

    def _merge(self, sb: bytes, refs: list, horizon: int, base: bool, report: dict, dropped: list = ()) -> None:
        """Replaces `refs` by their merge and deletes `dropped` (older runs nothing reads any
        more); a single run with nothing to fold stays as it is."""
        s = self.s
        dropped = list(dropped)
        if _kept_as_is(refs):
            added, removed, data = [], dropped, b""
        else:
            data = merge([self._view(r) for r in refs], horizon, base)
            added, removed = [(sb, data)], [*dropped, *refs]
        with s._tier_lock:
            new = s._disk.write(added, removed=removed)
            with s._cond:
                gone = {r.hi for r in removed}
                kept = [r for r in s._catalog.get(sb, ()) if r.hi not in gone]
                s._catalog[sb] = tuple(sorted([*kept, *new], key=lambda r: r.hi))
                s._drop_views(removed)
                s._publish_locked()
                s.stats.merges += 1
                s.stats.merged_bytes += len(data)
                self.removed_bytes += sum(r.nbytes for r in removed)
                s.stats.versions_dropped += sum(r.n + r.npairs + r.nhist for r in removed) - sum(
                    r.n + r.nhist for r in new
                )
        report["merges"] += 1
        report["merged_bytes"] += len(data)

    def _view(self, ref: RunRef) -> RunView:
        data = self.s._disk.read(ref)
        return RunView(data, f"{self.s.path}: run of state {decode_key(ref.state)[0]!r} at seq {ref.hi}")

    def _base_image(self, h: int, full: bool, report: dict) -> None:
        """Writes the state of every state at `h` to the remote tier when remote log segments
        at or below it are there to be dropped (or `full` asks), then drops them."""
        remote = self.s.remote
        stale = [f for f in remote.files if not f.base and f.last <= h]
        base = remote.base
        if h < 0 or not (stale or (full and (base is None or base.last < h))):
            return
        states = self.write_base(h)
        report["base_image"] = {"seq": h, "states": states}

    def write_base(self, h: int, horizon: int | None = None) -> int:
        """Writes a base image of every state as of `h` (REQUIRES: indexed up to `h`) to the
        remote tier, with every version a read at or after `horizon` (default `h`) can see;
        deletes the remote files it makes redundant, and returns how many states it holds. A
        failure is the remote tier's (PersistError)."""
        s = self.s
        remote = s.remote
        with s._cond:
            catalog = dict(s._catalog)
        try:
            rows = []
            for sb, refs in catalog.items():
                below = [r for r in refs if r.lo <= h]
                if below:
                    rows.append((sb, image([self._view(r) for r in below], h, horizon)))
            with s._tier_lock:
                remote.write_base(h, rows, horizon)
                for f in list(remote.files):
                    if (f.base and f.last < h) or (not f.base and f.last <= h):
                        remote.delete(f)
                with s._cond:
                    s._durable_remote = remote.durable()
        except OSError as e:
            raise PersistError("remote", s.path, e) from e
        return len(rows)

    def stop(self) -> None:
        """Stops the merges: none begins after the current one, and the merge thread is waited for
        (unless this is it)."""
        self._stopping = True
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join()

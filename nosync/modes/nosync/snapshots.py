"""The durability half of a nosync worker (`NosyncHooks`, which holds the state): lineage
points every few milliseconds and snapshots as the persistence budget permits, appended to the
worker's store in the background; a point or snapshot that became durable moves the worker's
durable point, trims the output logs of its peers and lets sinks commit.

Persistence runs as resources permit: its share of the worker's time (the snapshot's work on
this thread plus the store's encoding, logging, indexing and merging) is held under
`persist_budget`. After each snapshot is durable, the next interval is what that snapshot cost
divided by the budget, never less than `persist_ms` and never more than `max_persist_ms`: the
interval stretches under load (a longer recovery span) and shrinks back when there is room. The
bound keeps the span a recovery re-executes from growing with the state: when each key changes
about once an interval (many keys, few updates to each), a longer interval holds as many more
keys to persist, so stretching it would not lower persistence's share, only lengthen the span;
past the bound persistence takes what it needs, and `over_budget` counts the snapshots that did.
While a snapshot is not yet durable, no other is taken (`max_concurrent_snapshots`): the keys
changed meanwhile coalesce.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from lineage import Step
from lsm import ValueEncodingError
from nosync.api.sinks import ALL
from nosync.codec import pack
from nosync.modes.nosync.messages import NosyncOp
from nosync.runtime import control, frames
from nosync.runtime.keyed import JoinOp, KeyedOp
from nosync.runtime.operators import EOS
from nosync.state.layout import LINEAGE, META, OUT

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

log = logging.getLogger("nosync.nosync")

RETENTION_S = 64.0
"""Seconds of snapshots whose versions each worker's store keeps through merges (a rewind
starts from a consistent cut of them): `RetentionWindow`."""
PERSISTED = -1
"""The stash's mark for what lineage points persisted (as a peer's mark is for what it got)."""
POINT_S = 0.05
"""The longest a step stays without a lineage point (when no sink frontier moved meanwhile)."""
POINT_GAP_S = 0.01
"""The shortest time between two lineage points (a sink's frontier that moved asks for one)."""
HOLD_S = 0.25
"""How long a sink's frontier may stay where it is, while the sink holds records of an epoch two
past it, before lineage points pre-commit its open epochs (`_open_precommit`)."""
OPEN_GAP_S = 0.1
"""The shortest time between two pre-commits of a sink's open epochs."""
LOAD_SLICE_S = 0.002
"""How long a restored state loads at a time while the worker has nothing to read (`idle`):
a record that arrives meanwhile waits at most about this long."""


class RetentionWindow:
    """The snapshots whose versions a worker's store keeps: every one taken in the last
    `seconds`, and the newest one before them, so that the window is covered whole.

    A window in time, not in snapshots: the budget stretches the interval from `persist_ms` up
    to `max_persist_ms`, and a window of so many snapshots would hold that many times more
    history (and disk) under one load than under another. In time, the history kept is the
    updates of `seconds` whatever the interval, and the store's disk holds its level as long
    as the input rate does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.kept: deque[tuple[int, float]] = deque()
        """(seq, monotonic time) of each snapshot kept, oldest first: once one is older than the
        window, the oldest always is (the newest of those is never let go)."""

    def add(self, seq: int, t: float) -> int | None:
        """Takes in a snapshot at `seq`, taken at `t`; returns the store's retention (in seqs
        back from `seq`) once the window has filled, else None (every version kept)."""
        kept = self.kept
        kept.append((seq, t))
        edge = t - self.seconds
        while len(kept) > 1 and kept[1][1] <= edge:
            kept.popleft()
        return seq - kept[0][0] if kept[0][1] <= edge else None

    def restored(self, seqs: list[int], t: float) -> None:
        """The snapshots a restore found in the store, oldest first: their times are not
        recorded, so each counts as taken at `t` (kept at least `seconds` more)."""
        self.kept.extend((seq, t) for seq in seqs)


class Pending:
    """An append not yet durable: a lineage point, perhaps with a snapshot."""

    __slots__ = ("seq", "step", "frontier", "snapshot", "size", "taken", "cost", "read")

    def __init__(self, seq: int, step: int, frontier: int, snapshot: dict | None, size: int, read: int) -> None:
        self.seq, self.step, self.frontier, self.snapshot, self.size = seq, step, frontier, snapshot, size
        self.taken = time.monotonic()
        self.cost = 0.0
        self.read = read


class Snapshots:
    """Lineage points and snapshots of `NosyncHooks`; its attributes are the hooks'."""

    def _frontier(self, worker: Worker) -> int:
        # a loop's body sees rounds (waves), not epochs: the loop's tail, whose frontier moves
        # only once no record of an epoch goes round anywhere, stands for it
        return min((op.frontier for op in worker.ops if not op.node.params.get("loop_internal")), default=-1)

    def _cut(self, worker: Worker) -> None:
        """Flushes every exchange buffer (a logged step), then logs the frame counters per link:
        a cut a recovery can hand the steps before to a batch job (with a replay threshold)."""
        self.log_step((Step.FLUSHED_ALL,))
        for r in worker.routers:
            r.flush()
        self.log_step((Step.CUT, [self.produced.get(d, 0) for d in range(worker.workers)]))
        self.last_cut = self.step

    def _precommit(self, worker: Worker, seq: int, everything: bool) -> list:
        """Pre-commits, under `seq`, what the sinks staged: at a lineage point, for sealed epochs
        only (for open ones too when the sink's frontier is held, `_open_precommit`), and not
        durably (a recovery's replay makes it again, the steps before it being durable); at a
        snapshot, everything, durably (a restore starts after it), and every earlier pre-commit
        not yet committed is made durable too. Returns [sink, seq, upto] of each pre-commit made
        (upto None: everything staged)."""
        made = []
        now = time.monotonic()
        for s in worker.sinks:
            if everything:
                s.harden()
            opened = not everything and self._open_precommit(worker, s, now)
            upto = None if everything or opened else min(s.frontier, s.last_epoch)
            if not s.part.has_staged(ALL if upto is None else upto):
                continue
            if opened:
                self.open_precommits += 1
                self.open_at[s.name] = now
            s.precommit(seq, upto, durable=everything)
            made.append([s.name, seq, upto])
        return made

    def _open_precommit(self, worker: Worker, s: Any, now: float) -> bool:
        """Whether a lineage point pre-commits a sink's open epochs too, not only those its
        frontier sealed: while a peer is away (restoring, replaying), or while the frontier has
        not moved for HOLD_S though the sink holds records of an epoch two past it (a peer hung,
        or slow); at most every OPEN_GAP_S. The sink commits them once this worker's point is
        durable, as any pre-commit (`_commit_durable`): its output does not wait for the peer.
        """
        at = self.frontier_at.get(s.name)
        if at is None or at[0] != s.frontier:
            self.frontier_at[s.name] = at = (s.frontier, now)
        if s.frontier == EOS or s.last_epoch <= s.frontier or now - self.open_at.get(s.name, 0.0) < OPEN_GAP_S:
            return False
        held = s.last_epoch >= s.frontier + 2 and now - at[1] >= HOLD_S
        return held or bool(self.away) or not all(self.up.get(j) for j in worker.out)

    def _commit_durable(self, worker: Worker) -> None:
        """Commits every pre-commit at or below this worker's durable point: the per-sink rule
        (docs/modes/nosync.md, "Committing output"). What a pre-commit holds was staged by steps
        this worker logged; the lineage entries of every step of other workers those depend on
        came with the frames consumed and were persisted by the same lineage points. A durable
        point therefore lets any recovery re-execute the same steps, and nothing waits for the
        slowest worker."""
        for s in worker.sinks:
            s.commit_ready(lambda c: c <= self.durable_seq)

    def _append(self, worker: Worker, runs: dict, snapshot: dict | None, pcs: list) -> None:
        """One append to the store at the next seq: `runs`, and a lineage point (the entries
        held that no earlier point persisted, the sinks' pre-commits `pcs` made under that
        seq, the frontier)."""
        seq = self.store.last_seq + 1
        entries = {o: self.stash.delta(PERSISTED, o) for o in self.stash.origins()}
        frontier = self._frontier(worker)
        point = {
            "step": self.step,
            "entries": {o: e for o, e in entries.items() if e},
            "pc": pcs,
            "frontier": frontier,
        }
        runs[LINEAGE] = {0: pack(point)}
        # a lineage point alone is logged on this thread when it can be: one durable write of a
        # few hundred bytes costs less than the persister's wake-up and its hand-offs of the GIL
        now = snapshot is None and self.store_tier == "disk"
        try:
            size = self.store.append(seq, runs, log_now=now)
        except ValueEncodingError as e:
            raise worker.ops[e.state].state_error(e) from None
        if not now or self.store.durable("disk") < seq:
            self.store.persist(self.store_tier)
        self.level_marks.append((seq, time.monotonic()))
        self.unpersisted += size
        read = sum(s.records_in for s in worker.sources)
        self.pending.append(Pending(seq, self.step, frontier, snapshot, size, read))
        self.point_step = self.step
        self.last_point = time.monotonic()
        self.sink_frontiers = {s.name: s.frontier for s in worker.sinks}
        self.points += 1
        self.point_bytes += size

    def _snapshot(self, worker: Worker) -> None:
        t0 = time.thread_time()
        if self.cut_steps:
            self._cut(worker)
        # the sealed epochs go in a point of their own: the snapshot's pre-commit, which holds
        # the epochs still open, can commit only once the last of them is safe
        sealed = self._precommit(worker, self.store.last_seq + 1, everything=False)
        if sealed:
            self._append(worker, {}, None, sealed)
        seq = self.store.last_seq + 1
        # before the metadata, which holds the sinks' pre-commits
        pcs = self._precommit(worker, seq, everything=True)
        runs: dict = {}
        for i, op in enumerate(worker.ops):
            if isinstance(op, JoinOp):
                runs[i] = op.take_increments()
            elif isinstance(op, KeyedOp):
                runs[i] = op.take_updates()
        residue = self.outlog.residue()
        runs[OUT] = residue
        self.residue_bytes += sum(len(b["zstd"]) for b in residue.values())
        meta = {
            "step": self.step,
            "ops": {op.name: op.snapshot_meta() for op in worker.ops},
            "produced": self.produced,
            "consumed": self.consumed,
            "stash": {o: self.stash.entries(o) for o in self.stash.origins() if o != worker.index},
            "frontier": self._frontier(worker),
            "buffers": [
                [r.edge, d, r.buffer_epoch[d], frames.pack_records(r.buffers[d], r.sender)]
                for r in worker.routers
                for d in range(r.n)
                if r.buffers[d]
            ],
        }
        runs[META] = {0: pack(meta)}
        # narrowed before the append, so that no merge sees the new seq with the old window
        if (retention := self.kept.add(seq, time.monotonic())) is not None:
            self.store.options.retention = retention
        snapshot = {
            "step": self.step,
            "consumed": dict(self.consumed),
            "produced": dict(self.produced),
        }
        self._append(worker, runs, snapshot, pcs)
        self.pending[-1].cost = time.thread_time() - t0
        self.snapshots += 1
        self.snapshot_bytes += self.pending[-1].size
        self.snapshot_step = self.step
        self.last_snapshot = time.monotonic()

    def _under_way(self) -> int:
        """Snapshots taken and not yet durable."""
        return sum(1 for p in self.pending if p.snapshot is not None)

    def idle(self, worker: Worker, wait: float) -> float:
        """With nothing to read, a restored state still loading takes the time (`BulkLoader`):
        a slice of LOAD_SLICE_S, then the loop looks for input again at once."""
        loader = self.loader
        if loader is None or not loader.loading:
            return wait
        loader.advance(LOAD_SLICE_S)
        return 0.0

    def poll(self, worker: Worker) -> None:
        """Once per loop iteration: installs loaded state, takes a snapshot or a lineage point when
        one is due, a cut with a replay threshold, and takes in the appends made durable."""
        if self.loader is not None:
            self.loader.install_done(worker)
        self._replicate(worker)
        now = time.monotonic()
        if worker.sinks:
            ended = all(s.frontier == EOS for s in worker.sinks)
        else:
            ended = all(s.finished for s in worker.sources)
        # a stopped run ends with a snapshot of every step: the resumed run restores it and
        # replays nothing of the stop
        final = worker.stop.end_epoch != EOS and self._stopped_here(worker)
        # Invariant: at most max_concurrent_snapshots are under way (not durable). A snapshot
        # taken while the persister still works on the one before only queues behind it: it
        # makes no recovery shorter (a recovery restores the last durable snapshot), and each
        # writes every key changed since the last, so a persister that falls behind would fall
        # further behind. Waiting lets the changed keys coalesce instead.
        if (
            self.step > self.snapshot_step
            and (final or not ended)
            and (final or now - self.last_snapshot >= self.interval_s or self.unpersisted > self.max_unpersisted)
            and self._under_way() < self.max_concurrent_snapshots
        ):
            self._snapshot(worker)
        elif self.step > self.point_step or self._sinks_moved(worker):
            if (
                ended
                or now - self.last_point >= POINT_S
                or (self._sinks_moved(worker) and now - self.last_point >= POINT_GAP_S)
            ):
                self._append(worker, {}, None, self._precommit(worker, self.store.last_seq + 1, everything=False))
        if self.cut_steps and self.step - self.last_cut >= self.cut_steps:
            self._cut(worker)
        if self.pending:
            self._durable(worker)
        if any(s.deferred for s in worker.sinks):
            self._commit_durable(worker)  # a commit the fence held back, now that the lease may be back

    def stop_sources(self, worker: Worker, upto: int | None) -> None:
        """Logs the step that stops the sources (a replay stops them at the same point of the
        worker's steps), then stops them."""
        self.log_step((Step.STOPPED, upto))
        worker.stop_sources(upto)

    def _stopped_here(self, worker: Worker) -> bool:
        """Whether every operator passed the boundary the run stops at, and nothing is left to
        send: no step after it changes the state."""
        end = worker.stop.end_epoch
        return all(op.frontier >= end for op in worker.ops) and all(c.backlog == 0 for c in worker.out.values())

    def _sinks_moved(self, worker: Worker) -> bool:
        return any(self.sink_frontiers.get(s.name, -1) != s.frontier for s in worker.sinks)

    def _durable(self, worker: Worker) -> None:
        """Takes in the appends the store made durable: the worker's durable point moves, and
        each durable snapshot sets the next interval from what it cost."""
        durable = self.durable_seq_now()
        if self.pending[0].seq > durable:
            if self.store.error is not None:
                log.warning("worker %s: persisting: %s", worker.index, self.store.error)
            return
        last = None
        while self.pending and self.pending[0].seq <= durable:
            p = self.pending.popleft()
            self.unpersisted -= p.size
            if p.snapshot is not None:
                self._snapshot_durable(worker, p)
            last = p
        self.durable_seq = last.seq
        self.stash.trim(worker.index, self.durable_step)
        point = {
            "step": self.durable_step,
            "frontier": last.frontier,
            "lstep": last.step,
            "consumed": self.snap_point["consumed"] if self.snap_point else {},
            "produced": self.snap_point["produced"] if self.snap_point else {},
        }
        worker.send_ctrl(control.mode_message(NosyncOp.DURABLE, gen=worker.gen, point=point))
        self._commit_durable(worker)

    snap_point: dict | None = None
    _paced_base = 0.0
    """What the levels that can fall behind had taken at the last durable snapshot."""
    snapshot_cpu_s = 0.0
    """The processing thread's time in the durable snapshots (taking their state)."""
    open_precommits = 0
    """Lineage points' pre-commits of a sink's open epochs (its frontier held)."""
    over_budget = 0
    """Durable snapshots whose cost, divided by the budget, asked for an interval past
    `max_persist_s`: the next was taken at that bound, its persistence over the budget."""

    def _snapshot_durable(self, worker: Worker, p: Pending) -> None:
        self.durable_step = p.step
        self.snap_point = p.snapshot
        now = time.monotonic()
        st = self.store.stats
        spent = self.background_cpu_s()
        cost = p.cost + max(0.0, spent - self._cost_base)
        self._cost_base = spent
        self.persist_s_total += cost
        # what the levels that can fall behind took is theirs to pace (`LevelPacer`): the
        # interval stretches by the cost of the snapshot's own path only
        paced = self.pacer.gaps if self.pacer is not None else {}
        own = (st.upload_cpu_s if "remote" in paced else 0.0) + (self.replicate_cpu_s if "replicated" in paced else 0.0)
        stretched = max(0.0, cost - (own - self._paced_base)) / self.budget
        if stretched > self.max_persist_s:
            self.over_budget += 1
        self.interval_s = min(self.max_persist_s, max(self.persist_s, stretched))
        self._paced_base = own
        self.snapshot_cpu_s += p.cost
        n, total, most = self.intervals
        self.intervals = [n + 1, total + self.interval_s, max(most, self.interval_s)]
        # a loss just before this one was durable would have re-executed from the one before
        prev = getattr(self, "_prev_durable", None)
        if prev is not None:
            self.span_s_max = max(self.span_s_max, now - prev[0])
            read = sum(s.records_in for s in worker.sources)
            self.span_records_max = max(self.span_records_max, read - prev[1])
        self._prev_durable = (p.taken, p.read)

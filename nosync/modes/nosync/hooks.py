"""The worker half of mode nosync in steady state: steps, frames, lineage points, snapshots.

A worker is a deterministic state machine over the steps it takes, one thread taking them one
at a time: read a chunk of a source, process a frame that arrived from a peer, flush an
exchange buffer whose linger time ran out. Every step is numbered (`step`, the op_seq of every
instance on the worker, since they all advance together) and logged as a lineage entry
*before* it runs: ("s", source, epoch) - ("i", peer, chan_seq) - ("f", router, peer) - ("F",),
a flush of every buffer - ("C", counters), a cut (with a replay threshold). Everything else an
operator does is a function of its state and its input, so replaying the entries in order
re-produces the same frames, bit for bit.

Every frame on the link to a peer carries `(edge, chan_seq, epoch, fingerprint)` and, in its
header, the lineage entries the receiver does not hold yet - the sender's own and those of
every other worker it holds (causal logging); more than a header holds go in a LINEAGE frame
just before it. The frame stays in the sender's output log (`outlog.py`), in memory, until the
receiver's durable point covers it.

Durability comes in two sizes, both appends to the worker's `lsm` store: a snapshot is made
durable by its persister in the background (never waited for, except past `max_unpersisted_mb`
not yet durable: backpressure, the stall reported), a point by this thread's own write when
it can be (`snapshots.py`):

- a **lineage point**, every few milliseconds when steps were taken, and at once when a sink's
  frontier advanced: the lineage entries held that no earlier point persisted (this worker's
  own and the others' it holds), and a pre-commit of what the sinks staged for sealed epochs.
  Once it is durable, the worker's durable point is its step: a recovery replays the steps up
  to it from the snapshot before it, re-producing everything, so output up to it may be
  committed. A sink commits a pre-commit once it is durable here: the lineage of every step
  elsewhere that its records depend on came with the frames and is in the same points, so no
  sink waits for another worker (`Snapshots._commit_durable`). Commit latency is a few
  milliseconds, whatever the snapshot interval;
- a **snapshot**, every `persist_ms` or later (`snapshots.py`): a keyed operator's changed keys since the
  last one as one run (`take_updates`, one C pass), the residue of the output log, the
  records in the exchange buffers (they are not flushed), a pre-commit of everything staged,
  and the metadata (frontiers, source positions, frame counters, lineage held for others). A
  snapshot bounds what a recovery re-executes, and what peers keep: output logs and lineage
  are trimmed by the receivers' durable snapshots.

Persistence runs as resources permit (`snapshots.py`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Mapping
from itertools import takewhile
from typing import TYPE_CHECKING, Any

import xxhash

from lineage import Stash, Step
from nosync.errors import RunFailed
from nosync.modes.nosync import recovery, span
from nosync.modes.nosync.levels import STORE, Levels
from nosync.modes.nosync.messages import NosyncOp
from nosync.modes.nosync.outlog import OutputLog
from nosync.modes.nosync.snapshots import RETENTION_S, Pending, RetentionWindow, Snapshots
from nosync.options import RunOptions
from nosync.runtime import frames
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.operators import EOS
from nosync.state.inputlog import InputLog
from nosync.state.layout import INPUT as INPUT_NAME
from nosync.state.layout import STORE as STORE_NAME
from nosync.state.stores import open_store

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

log = logging.getLogger("nosync.nosync")

CONSUMED, READ, FLUSHED = Step.CONSUMED.value, Step.READ.value, Step.FLUSHED.value
"""The kinds of the steps taken per frame, chunk and buffer, as plain strings: every frame's
header carries entries, and msgpack packs a str subclass (an enum member) on its slow path."""
HEADER_LINEAGE = 1500
"""Lineage entries a frame's header carries at most, over all origins (an entry packs to 31
bytes at most: within frames.MAX_HEADER). More (a backlog) go in a LINEAGE frame just before
the frame, on the same link, so the receiver holds every entry the frame depends on first."""
AHEAD_RECORDS = 500_000
"""Records a replaying worker holds credited, of the frames its peers send meanwhile (about 50
MB), so that they go on at full speed; beyond it, a frame waits for its credit."""


class NosyncHooks(Snapshots, Levels, WorkerHooks):
    """The worker half of mode nosync: logs every step as lineage, numbers and keeps the frames it
    sends, persists lineage points and snapshots, and recovers a worker alone."""

    name = "nosync"
    sink_commits_at_frontier = False
    tracks_dirty = True
    recovers = True
    accepts_peers = True

    def __init__(self, options: RunOptions | Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        o = self.options
        self.tier = o.checkpoint_tier
        self.persist_s = o.persist_ms / 1000
        self.max_persist_s = o.persist_bound_ms / 1000
        self.budget = o.persist_budget
        self.max_unpersisted = o.max_unpersisted_mb << 20
        self.max_concurrent_snapshots = o.max_concurrent_snapshots
        self.max_out_mem = o.max_output_log_mb << 20
        self.threshold = o.replay_threshold_records
        self.interval_s = self.persist_s
        """The snapshot interval now: `persist_s` stretched by the budget, up to `max_persist_s`."""
        self.intervals = [0, 0.0, 0.0]
        """The snapshot intervals set so far: count, sum, greatest (bounded, for any run length)."""
        self.span_s_max = 0.0
        self.span_records_max = 0
        self.persist_s_total = 0.0
        self.cut_steps = 0
        self.span_reason: str | None = None
        self.span_steps = 0
        self.span_records = 0
        self.span_s = 0.0
        self.span_parts: dict = {}
        self.store: Any = None
        self.inputs: Any = None
        self.input_logs: list[InputLog] = []
        self.w: Any = None
        self.stall_s = 0.0
        self.snapshots = 0
        self.snapshot_bytes = 0
        self.points = 0
        self.point_bytes = 0
        self.residue_bytes = 0
        self.replayed_steps = 0
        self.replayed_source_records = 0
        self.replayed_frames = 0
        self.replayed_frame_records = 0
        self.read_restored = 0
        self.dropped_frames = 0
        self.lineage_frames = 0
        self.recovered = False
        self.restore_s = 0.0
        self.restore_meta_s = 0.0
        self.keys_read_alone = 0
        self.load_s = self.load_wait_s = 0.0
        self.outlog: OutputLog | None = None
        self.level_marks: deque = deque()
        """(seq, time) of appends some level does not hold yet."""
        self.level_lag_s: dict[str, float] = {}
        self.restoring = False
        self.seeded_from: dict | None = None
        self.lost_store = False
        self._reset()

    def _reset(self) -> None:
        self.step = 0
        self.stash = Stash()
        self.produced: dict[int, int] = {}
        self.consumed: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.fps: dict[int, dict[int, int]] = {}
        self.up: dict[int, bool] = {}
        self.resumed: dict[int, bool] = {}
        self.away: set[int] = set()  # lost, restoring or replaying, as the coordinator last said
        self.resume_from: dict[int, int] = {}
        self.lineage_attempt: dict[int, int | None] = {}
        """Per peer, the attempt whose LINEAGE frame set `resumed` and `resume_from`."""
        self.pending: deque[Pending] = deque()
        self.unpersisted = 0
        self.durable_seq = -1
        """The seq of the last durable append: pre-commits at or below it may commit."""
        self.durable_step = 0
        """The step of the last durable snapshot (what peers trim output logs and lineage by)."""
        self.point_step = 0
        self.last_point = 0.0
        self.sink_frontiers: dict[str, int] = {}
        self.last_snapshot = time.monotonic()
        self.snapshot_step = -1
        self.kept = RetentionWindow(RETENTION_S)
        """The snapshots whose versions the store keeps."""
        self.safe = -1
        self.frontier_at: dict[str, tuple[int, float]] = {}
        """Per sink, its frontier and when it last moved (`Snapshots._open_precommit`)."""
        self.open_at: dict[str, float] = {}
        """Per sink, when a lineage point last pre-committed its open epochs."""
        self.queue: dict[int, deque] = {}
        self.ahead: dict[int, dict[int, int]] = {}
        """Per peer, the frames of `queue` credited on arrival (chan_seq -> records)."""
        self.ahead_records = 0
        self.replaying = False
        self.pc_at: dict[int, list] = {}
        """During a replay: step -> the pre-commits a lineage point made right after it."""
        self._stall_from: float | None = None
        self.last_cut = 0
        self.peer_consumed: dict[int, int] = {}
        """Per peer, the frames of the link to it that it had consumed when it (re)connected."""
        self.peer_points: dict[int, dict] = {}
        self.span_done: dict | None = None
        self.loader: Any = None
        self.snap_seq = -1
        """The seq of the snapshot a recovery restored (-1: none)."""
        self._cost_base = 0.0

    # -- the log of steps ---------------------------------------------------------------

    def log_step(self, entry: tuple) -> None:
        """Takes the next step: `entry` (its kind, `lineage.Step`, first) joins this worker's lineage."""
        self.step += 1
        self.stash.add(self.w.index, [(self.step, entry)])

    def poll_source(self, worker: Worker, source: Any) -> bool:
        """Logs the step that reads one chunk of `source` (with the clock's epoch
        under --epoch-ms), then reads it."""
        e = source.time_epoch() if worker.epoch_ms else None
        self.log_step((READ, worker.sources.index(source), e))
        return source.poll(e)

    def flush_routers(self, worker: Worker) -> None:
        """Logs a step for each exchange buffer past the linger time, then sends it."""
        linger = worker.linger_s
        for ri, r in enumerate(worker.routers):
            for d in r.due(linger):
                self.log_step((FLUSHED, ri, d))
                r.send_buffer(d)

    def send_frame(self, worker: Worker, dest: int, kind: int, header: dict, data: bytes) -> None:
        """Numbers the frame on the link to `dest`, adds its fingerprint and the lineage `dest`
        lacks, keeps it in the output log and sends it if the link is up."""
        seq = self.produced.get(dest, 0) + 1
        self.produced[dest] = seq
        # a copy: a broadcast hands every destination the same header, and each gets its own lineage
        header = {**header, "s": seq, "fp": xxhash.xxh64_intdigest(data)}
        lin = {}
        held = 0
        for origin in self.stash.origins():
            if origin != dest:
                got = self.stash.delta(dest, origin)
                if got:
                    lin[origin] = got
                    held += len(got)
        if held > HEADER_LINEAGE:
            self.lineage_frames += 1
            if self.up.get(dest):
                # counted like a data frame, so that it keeps its place in the link's order
                worker.out[dest].send(frames.encode(frames.LINEAGE, {"more": 1}, {"lin": lin}))
        elif lin:
            header["lin"] = lin
        frame = frames.encode_packed(kind, header, data)
        self.outlog.add(dest, seq, frame)
        if self.up.get(dest):
            worker.out[dest].send(frame)

    def _take_lineage(self, header: dict) -> None:
        lin = header.get("lin")
        if lin:
            me = self.w.index
            for origin, entries in lin.items():
                if origin != me:
                    self.stash.add(int(origin), entries)

    def accept_frame(self, worker: Worker, j: int, f: Any) -> bool:
        """Whether a frame from worker `j` is processed now: not a LINEAGE frame, one processed
        before (its fingerprint checked) or one queued during a replay; a gap fails the run."""
        if self.replica_frame(worker, j, f):
            return False
        if f.kind == frames.LINEAGE:
            self._on_lineage(worker, j, f)
            return False
        h = f.header
        seq = h.get("s")
        if seq is None:
            raise RunFailed(f"worker {worker.index}: a frame from worker {j} has no chan_seq")
        last = self.received.get(j, 0)
        if seq <= last:
            # re-produced by a recovering peer: already processed here
            seen = self.fps.get(j, {}).get(seq)
            if seen is not None and seen != h.get("fp"):
                raise RunFailed(
                    f"worker {worker.index}: frame {seq} from worker {j} was re-produced with different "
                    f"records (fingerprint {h.get('fp'):x}, processed {seen:x}): an operator upstream is not "
                    "deterministic given its input order"
                )
            self.dropped_frames += 1
            worker.credit(j)
            return False
        if seq != last + 1:
            raise RunFailed(f"worker {worker.index}: frame {seq} from worker {j} arrived after frame {last}")
        self.received[j] = seq
        self._take_lineage(h)
        if self.replaying or self.queue.get(j):
            self.queue.setdefault(j, deque()).append(f)
            if self.replaying and self.ahead_records < AHEAD_RECORDS:
                # held while the replay goes on: credited now, so that the sender goes on too
                n = len(f.body) if f.kind == frames.DATA and isinstance(f.body, list) else 1
                self.ahead.setdefault(j, {})[seq] = n
                self.ahead_records += n
                worker.credit_ahead(j)
            return False
        self.consume(j, seq, h)
        return True

    def consume(self, j: int, seq: int, h: dict) -> None:
        """Logs the step that processes frame `seq` from worker `j`."""
        ahead = self.ahead.get(j)
        if ahead:
            self.ahead_records -= ahead.pop(seq, 0)
        self.log_step((CONSUMED, j, seq))
        self.consumed[j] = seq
        self.fps.setdefault(j, {})[seq] = h.get("fp")

    def drain(self, worker: Worker) -> None:
        """Processes frames queued while replaying, link by link."""
        for j in list(self.queue):
            q = self.queue[j]
            while q:
                f = q.popleft()
                self.consume(j, f.header["s"], f.header)
                worker.process_frame(j, f)
        self.queue = {}

    # -- links with peers ----------------------------------------------------------------

    def lineage_frame(self, peer: int) -> bytes:
        """What this worker tells a peer it (re)connects to: the chan_seq it wants the link's
        frames from, and every lineage entry it holds of other workers."""
        self.stash.reset_marks(peer)
        lin = {o: self.stash.entries(o) for o in self.stash.origins() if o != self.w.index}
        return frames.encode(frames.LINEAGE, {"resume": self.consumed.get(peer, 0) + 1}, {"lin": lin, "for": peer})

    def _on_lineage(self, worker: Worker, j: int, f: Any) -> None:
        """A LINEAGE frame from peer `j`: the entries that did not fit in the header of the
        frame after it (`more`), or, when `j` (re)connected, the entries it holds, and the
        chan_seq from which it wants the frames of the link to it again."""
        if f.header.get("more"):
            if isinstance(f.body, dict):
                self._take_lineage(f.body)
            worker.credit(j)
            return
        body = f.body
        if isinstance(body, dict):
            for origin, entries in (body.get("lin") or {}).items():
                if int(origin) != j:
                    self.stash.add(int(origin), entries)
        self.resumed[j] = True
        self.resume_from[j] = int(f.header.get("resume", 1))
        self.peer_consumed[j] = self.resume_from[j] - 1
        self.lineage_attempt[j] = getattr(worker.inc.get(j), "attempt", None)
        self._try_resume(worker, j)

    def _try_resume(self, worker: Worker, j: int) -> None:
        """Sends peer `j` its frames again from where it asked, once connected to the attempt
        that asked (its LINEAGE frame can arrive before the loss of an earlier attempt is
        known here, while the sending connection still goes to that one)."""
        conn = worker.out.get(j)
        if conn is None or j not in self.resume_from:
            return
        if getattr(conn, "attempt", None) != self.lineage_attempt.get(j):
            return  # "peer_back" opens the connection to the attempt that asked, and resumes
        start = self.resume_from.pop(j)
        first = self.outlog.first(j)
        if first is not None and first > start:
            raise RunFailed(
                f"worker {worker.index}: worker {j} asks for frames from {start}, the output log starts at {first}"
            )
        if first is None and self.produced.get(j, 0) >= start:
            raise RunFailed(
                f"worker {worker.index}: worker {j} asks for frames from {start}, the output log is trimmed "
                f"up to {self.produced.get(j, 0)}"
            )
        for frame in self.outlog.since(j, start):
            conn.send(frame, resend=True)
        self.up[j] = True

    def on_peer_down(self, worker: Worker, peer: int, attempt: int | None = None) -> None:
        """Marks the link to `peer` down and forgets what its lost attempt asked for; its frames
        received but not processed will come again."""
        if peer not in worker.out:
            self.up[peer] = False
        asked = self.lineage_attempt.get(peer)
        if attempt is None or asked is None or asked <= attempt:
            # what the lost attempt asked for goes with it (a newer attempt's request stays)
            self.resumed[peer] = False
            self.resume_from.pop(peer, None)
            self.lineage_attempt.pop(peer, None)
        if peer not in worker.inc:
            # frames of it received but not processed come again
            self.queue.pop(peer, None)
            self.ahead_records -= sum(self.ahead.pop(peer, {}).values())
            self.received[peer] = self.consumed.get(peer, 0)

    def on_control(self, worker: Worker, message: dict) -> None:
        """Takes the coordinator's mode messages: durable points, a lost peer, a span job done, a
        request to snapshot now, a peer that came back."""
        op = message.get("op")
        if op == NosyncOp.POINTS:
            self._on_points(worker, message)
        elif op == NosyncOp.LOST:
            j = int(message["worker"])
            self.away.add(j)
            if j != worker.index:
                # its connections go (not a newer attempt's), and it never connects again
                worker.fence_peer(j, int(message.get("attempt", 0)))
        elif op == NosyncOp.SPAN_DONE:
            self.span_done = message  # `span.run_span_job` checks that it is its own job's
        elif op == NosyncOp.SNAPSHOT_NOW:
            if int(message.get("worker", -1)) != worker.index:
                self.last_snapshot = 0.0  # a recovering peer waits for our durable point
                self.interval_s = self.persist_s
        elif op == NosyncOp.PEER_BACK:
            j = int(message["worker"])
            if j == worker.index:
                return
            self.up[j] = False
            conn = worker.connect_peer(j, list(message["address"]), int(message.get("attempt", 0)))
            conn.send_uncounted(self.lineage_frame(j))
            self._try_resume(worker, j)
            if self.replicas is not None:
                self.replicas.serve(worker)  # the copies it asked for, now that it is connected

    def _on_points(self, worker: Worker, message: dict) -> None:
        me = worker.index
        points = {int(w): p for w, p in message["points"].items()}
        self.peer_points = points
        for w, p in points.items():
            if w != me:
                self.stash.trim(w, int(p["step"]))
                self.outlog.trim(w, int(p["consumed"].get(me, 0)))
                prod = int(p["produced"].get(me, 0))
                fp = self.fps.get(w)
                # seqs go in ascending: those the point covers are a prefix (O(covered))
                for s in list(takewhile(prod.__ge__, fp)) if fp else ():
                    del fp[s]
        self.safe = int(message.get("safe", -1))
        self.away = set(message.get("away", ()))
        self._commit_durable(worker)

    # -- lineage points and snapshots -------------------------------------------------------

    def may_read(self, worker: Worker) -> bool:
        """Whether sources may be read: not while more than `max_unpersisted_mb` of appends are not
        durable (the stall is timed)."""
        if self.unpersisted <= self.max_unpersisted:
            if self._stall_from is not None:
                self.stall_s += time.perf_counter() - self._stall_from
                self._stall_from = None
            return True
        if self._stall_from is None:
            self._stall_from = time.perf_counter()
        return False

    def peers_up(self, worker: Worker) -> bool:
        """No worker away (lost, restoring, replaying) and every link up; until then all read on."""
        return not self.away and not self.replaying and all(self.up.get(j) for j in worker.out)

    def can_finish(self, worker: Worker) -> bool:
        """Whether every step is in a lineage point (a stopping run's: in a snapshot), no append
        awaits durability, the sinks committed everything and every link to a peer resumed."""
        return (
            self.point_step == self.step == (self.step if worker.stop.end_epoch == EOS else self.snapshot_step)
            and not self.pending
            and not any(s.uncommitted for s in worker.sinks)
            and all(self.resumed.get(j) for j in worker.out)
        )

    # -- start, restore -------------------------------------------------------------------

    def _open_store(self, worker: Worker) -> None:
        if self.store is not None:
            return
        # every version until the retention window has filled (`_snapshot` narrows it)
        self.store = open_store(
            worker,
            STORE_NAME,
            f"the nosync log {worker.places.store(worker.index, STORE_NAME)}",
            retention=1 << 62,
            budget=self.budget,
            uploads=self.tier == "remote",
            on_logged=None if self.replicas is None else (lambda recs: self.replicas.logged(STORE, recs)),
        )
        if self.replicas is not None:
            self.replicas.add_store(STORE, self.store)

    def on_start(self, worker: Worker, peers: dict) -> None:
        """Opens the store, the output log and the input logs of unreplayable sources; a restore or
        a restart recovers the worker (`recovery.recover`)."""
        self.w = worker
        self._reset()
        if self.outlog is not None:
            self.outlog.close()
        spill = os.path.join(worker.places.local_root(worker.index), f"outlog-a{worker.attempt}.spill")
        self.outlog = OutputLog(spill, self.max_out_mem)
        if self.threshold:
            self.span_reason = span.eligible(worker.plan)
            if self.span_reason is not None:
                self.span_reason = f"the pipeline is not eligible: {self.span_reason}"
            else:
                # a cut every quarter of the threshold (64 steps at least: a cut's entry is
                # bigger than the others, and frame headers carry a bounded number of entries)
                self.cut_steps = max(64, int(self.threshold) // (4 * worker.batch_size))
        restore = self.restoring = bool(peers.get("restore")) or worker.attempt > 0
        self._levels_start(worker)
        self._open_store(worker)
        self.input_logs = []
        for i, src in enumerate(worker.sources):
            if not src.source.replayable:
                if self.inputs is None:
                    path = worker.places.store(worker.index, INPUT_NAME)
                    self.inputs = open_store(
                        worker, INPUT_NAME, f"the input log {path}", retention=0, uploads=self.store_tier == "remote"
                    )
                src.source = InputLog(src.source, i, self.inputs, self.store_tier)
                self.input_logs.append(src.source)
        self.alone = bool(peers.get("alone"))
        for j in worker.out:
            self.up[j] = False
        if not restore:
            for j in worker.out:
                self.up[j] = True
                self.resumed[j] = True
            return
        recovery.recover(self, worker)

    def debug_state(self, worker: Worker) -> dict:
        """Steps, durable points, links, queues, the output log and the sinks not committed,
        for `Worker.dump_state`."""
        return {
            "step": self.step,
            "snapshot_step": self.snapshot_step,
            "durable_step": self.durable_step,
            "durable_seq": self.durable_seq,
            "pending": [p.seq for p in self.pending],
            "safe": self.safe,
            "replaying": self.replaying,
            "up": self.up,
            "resumed": self.resumed,
            "resume_from": self.resume_from,
            "received": self.received,
            "consumed": self.consumed,
            "produced": self.produced,
            "queued": {j: len(q) for j, q in self.queue.items()},
            "outlog": {j: [q[0][0], q[-1][0], len(q)] if q else [] for j, q in self.outlog.frames.items()},
            "sinks_uncommitted": [s.name for s in worker.sinks if s.uncommitted],
            "sinks_deferred": [s.name for s in worker.sinks if s.deferred],  # held back by the lease
            "interval_s": self.interval_s,
        }

    def metrics(self, worker: Worker) -> dict:
        """Persistence (snapshots, lineage points, bytes, stall, intervals), spans, replays, frames,
        the output log and input logging."""
        stall = self.stall_s
        if self._stall_from is not None:
            stall += time.perf_counter() - self._stall_from
        st = self.store.stats if self.store is not None else None
        return {
            "steps": self.step,
            "snapshots": self.snapshots,
            "snapshot_bytes": self.snapshot_bytes,
            "lineage_points": self.points,
            "open_precommits": self.open_precommits,
            "over_budget": self.over_budget,
            "lineage_points_logged_here": st.logged_now if st else 0,
            "lineage_point_bytes": self.point_bytes - self.snapshot_bytes,
            "residue_bytes": self.residue_bytes,
            "output_log_peak_bytes": self.outlog.peak if self.outlog is not None else 0,
            "persist_stall_s": stall,
            "persist_s": self.persist_s_total,
            "interval_s_mean": self.intervals[1] / self.intervals[0] if self.intervals[0] else self.interval_s,
            "interval_s_max": self.intervals[2] if self.intervals[0] else self.interval_s,
            "span_s_max": self.span_s_max,
            "span_records_max": self.span_records_max,
            "merges": st.merges if st else 0,
            "bytes_persisted": (st.appended_bytes if st else 0)
            + (self.inputs.stats.appended_bytes if self.inputs is not None else 0),
            "replayed_steps": self.replayed_steps,
            "dropped_frames": self.dropped_frames,
            "lineage_frames": self.lineage_frames,
            "restore_s": self.restore_s,
            "output_log_frames": self.outlog.count() if self.outlog else 0,
            "output_log_bytes": self.outlog.mem if self.outlog else 0,
            "output_log_spilled_frames": self.outlog.spilled if self.outlog else 0,
            "residue_frames_resent": self.outlog.resent_from_residue if self.outlog else 0,
            "lineage_entries": sum(len(self.stash.entries(o)) for o in self.stash.origins()),
            "input_logged_records": sum(x.logged_records for x in self.input_logs),
            "input_log_s": sum(x.log_s for x in self.input_logs),
        } | self.levels_metrics()

    def close(self, worker: Worker) -> None:
        """Stops the bulk loader (waiting for its readers' builds), closes the output log and stores
        (a replaced attempt abandons them)."""
        if self.loader is not None:
            self.loader.stop()
        if self.outlog is not None:
            self.outlog.close()
        for store in (self.store, self.inputs):
            if store is not None:
                try:
                    store.abandon() if worker.replaced else store.close()
                except Exception:  # noqa: BLE001 - closing after a failure must not hide it
                    log.exception("closing %s", store.path)
        self.store = self.inputs = None

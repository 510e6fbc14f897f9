"""Mode `nosync`: no barrier, no alignment; a failed worker recovers alone from its own log.

Steady state. A worker is a deterministic state machine over the steps it takes, one thread
taking them one at a time: read a chunk of a source, process a frame that arrived from a peer,
flush an exchange buffer whose linger time ran out. Every step is numbered (`step`, the op_seq
of every instance on the worker, since they all advance together) and logged as a lineage
entry *before* it runs: ("s", source, epoch) — ("i", peer, chan_seq) — ("f", router, peer) —
("F",), a flush of every buffer. Everything else an operator does is a function of its state
and its input, so replaying the entries in order re-produces the same frames, bit for bit.

Every frame on the link to a peer carries `(edge, chan_seq, epoch, fingerprint)` (chan_seq per
link, the fingerprint an xxh64 of the encoded records) and, in its header, the lineage entries
the receiver does not hold yet — the sender's own and those of every other worker it holds
(causal logging: whoever received a frame holds the entries of every step the frame depends
on, transitively); more than a header holds go in a LINEAGE frame just before it. The frame
stays in the sender's output log until the receiver's durable point covers it; past
`max_output_log_mb` in memory, frames already durable in a snapshot are dropped from memory
(spilled) and read back from the store if a peer asks for them again.

Every `persist_ms`, or later, the worker takes a local snapshot between two steps, alone:
exchange buffers are flushed (a logged step), sinks pre-commit what they staged, and one
`append` to the worker's `lsm` store at seq = step carries the keyed updates of every instance
since the last one (deletions as tombstones), the output-log frames added and trimmed since,
and a small meta record (frontiers, source positions, sink pre-commits, chan_seq counters, the
lineage held for others). The store's persister makes it durable and indexes it in the
background; the processing thread never waits, except when more than `max_unpersisted_mb` is
not durable yet (snapshots under way, and frames sent since the last one: backpressure, the
stall time reported). While `max_concurrent_snapshots` (1) of its snapshots are still being
persisted, a worker takes no other: the keys changed meanwhile coalesce into the next one, and
the interval grows to what persisting takes on the worker's core. A durable snapshot is
reported to the coordinator as the worker's durable point (step, frontier, consumed and
produced chan_seq per link); the coordinator broadcasts the points, which trim output logs and
lineage everywhere, and the safe point (the least durable frontier): a sink commits a
pre-commit once the safe point passes every epoch in it. Compaction keeps every version of the
last RETENTION snapshots, so a rewind can start from a consistent cut of them
(`rewind.find_snapshot_cut`).

Recovery of one worker. The survivors go on; what they send the dead worker stays in their
output logs. Spark's retry of the task re-registers; the coordinator gives it the peers and
tells the survivors where it is. It opens its store at its last durable snapshot (the disk
tier, or the remote tier when the disk tier is gone), loads keyed state lazily (a key is read
from the store when a record first touches it), and exchanges one LINEAGE frame with every
survivor each way: the first chan_seq to send again, and the lineage entries held for the
other. The merged entries after the snapshot are replayed in their order — sources read again
from the snapshot's positions, frames taken from what the survivors resend — and re-produced
frames that a survivor already processed are dropped by chan_seq after their fingerprint is
checked. Then it runs live. A second worker lost while one recovers, or `run --resume`, makes
every worker restore its own last snapshot and replay the same way (a new generation).

With `replay_threshold_records`, every worker also logs a cut now and then (a flush of every
buffer, then its frame counters per link), and a recovery whose span holds more records than
the threshold hands the steps up to its last cut that every survivor has consumed to a Spark
batch job, parallel over keys, once the survivors' durable points cover that cut (they are
asked for a snapshot); only the steps after the cut are re-executed here. `nosync_span` tells
that story, and which pipelines it applies to.

A source that cannot restart from a position (TcpLines) goes through an input log: every
chunk it delivers is appended to the worker's input store and made durable (fsynced) before
any record of it is processed, so a replay reads the same chunks back from the log, and past
its end the source goes on live. Lines the server had sent that the lost process had not
logged yet are gone with its connection.

Left out: the rollback cascade for a fingerprint mismatch (a user function that is not
deterministic given its input order fails the run, naming the link and chan_seq).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import deque
from typing import Any

import msgpack
import xxhash

from lineage import LineageError, Stash, recovery_plan, safe_point
from lsm import TOMBSTONE
from nosync import frames, statecodec
from nosync.errors import RunFailed
from nosync.modes import Mode, WorkerHooks, open_store
from nosync.operators import EOS, MISSING_STATE, JoinOp, KeyedOp, Op, SinkOp, WindowOp

log = logging.getLogger("nosync.nosync")

REPLAY_TIMEOUT_S = 120.0
COVER_TIMEOUT_S = 30.0
"""How long a worker whose span job is done waits for its survivors' durable points to cover
the job's cut (they were asked for a snapshot) before it re-executes the span itself."""
META = ("_m",)
OUT = "_o"
RETENTION = 64
"""Snapshots whose versions each worker's store keeps through compaction (a rewind starts
from a consistent cut of them); more survive until the next compaction."""
HEADER_LINEAGE = 1500
"""Lineage entries a frame's header carries at most, over all origins: an entry packs to 31
bytes at most, so the header stays within its bound (frames.MAX_HEADER). More than that (a
backlog: a peer that reconnected, a link that carries little) go in a LINEAGE frame of their
own just before the frame, in order on the same link, so the receiver holds every entry the
frame depends on before it processes it."""


def store_path(run_dir: str, worker: int) -> str:
    return os.path.join(run_dir, "state", f"w{worker}", "nosync")


def input_store_path(run_dir: str, worker: int) -> str:
    return os.path.join(run_dir, "state", f"w{worker}", "input")


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def iter_snapshots(store: Any) -> Any:
    """The metadata of each snapshot a worker's store still holds in full (its keyed state
    readable as of the snapshot's step), newest first, without the lineage held for others."""
    from lsm import RetentionError

    as_of = None
    while as_of is None or as_of >= 0:
        try:
            raw = store.get(META, as_of=as_of)
        except RetentionError:
            return
        if raw is None:
            return
        meta = _unpack(raw)
        step = int(meta["step"])
        if step < store.horizon:
            return
        yield {k: v for k, v in meta.items() if k != "stash"}
        as_of = step - 1


def logged_frames(store: Any, dest: int, as_of: int) -> dict[int, bytes]:
    """chan_seq -> frame of the output log to worker `dest` as it stood after step `as_of`."""
    return {int(key[2]): frame for key, frame in store.scan((OUT, dest), as_of=as_of)}


def store_state(store: Any, i: int, op: Any, as_of: int) -> None:
    """Loads the keyed state of keyed operator `op` (the worker's operator number `i`) as it
    stood after step `as_of`, all of it at once."""
    items = store.scan((i,), as_of=as_of)
    if isinstance(op, JoinOp):
        # a key's increments are contiguous in the scan, in index order
        for k, increments in itertools.groupby(items, key=lambda kv: kv[0][1]):
            op.state[k] = _join_sides(increments)
    else:
        op.restore_keyed((key[1], v) for key, v in items)


class InputLog:
    """A source that cannot restart from a position, made replayable: the chunks it delivers
    are logged, keyed (source, partition, first record), and durable before they are handed
    on; `read` from a position serves the logged chunks from there, then the live source.
    With `live` False (a batch job reading a copy of a run's log) it ends where the log ends;
    `tier` is then unused."""

    replayable = True

    def __init__(self, inner: Any, index: int, store: Any, tier: str | None, live: bool = True) -> None:
        self.inner, self.index, self.store, self.tier, self.live = inner, index, store, tier, live
        self.log_s = 0.0
        self.logged_records = 0

    def partitions(self, workers: int | None = None) -> list[dict]:
        return self.inner.partitions(workers)

    def describe(self) -> str:
        return self.inner.describe()

    def read(self, part: dict, offset: Any, chunk: int, on_bad: Any) -> Any:
        pid = _pack(part)
        pos = int(offset or 0)
        for (_, _, start), recs in self.store.scan((self.index, pid)):
            if recs is None:
                return  # the live source had ended: it ends here again
            if start + len(recs) <= pos:
                continue
            if start < pos:
                # positions are chunk starts; a chunk is never split, but be exact anyway
                recs = recs[pos - start :]
            pos += len(recs)
            yield list(recs), pos
        if not self.live:
            return  # a killed run's log has no end mark: what it logged is all there is
        # past the log: the source live, from what its new connection delivers
        for recs, _ in self.inner.read(part, None, chunk, on_bad):
            self._append(pid, pos, recs)
            self.logged_records += len(recs)
            pos += len(recs)
            yield recs, pos
        self._append(pid, pos, None)  # its end too: a replay must not read past it

    def _append(self, pid: bytes, pos: int, recs: list | None) -> None:
        t0 = time.perf_counter()
        self.store.append(self.store.last_seq + 1, [((self.index, pid, pos), recs)])
        self.store.flush(self.tier)
        self.log_s += time.perf_counter() - t0


class NosyncHooks(WorkerHooks):
    name = "nosync"
    sink_commits_at_frontier = False
    tracks_dirty = True
    recovers = True
    accepts_peers = True

    def __init__(self, options: dict | None = None) -> None:
        super().__init__(options)
        o = self.options
        self.tier = o.get("persist_tier", "disk")
        self.persist_s = o.get("persist_ms", 200) / 1000
        self.max_unpersisted = int(o.get("max_unpersisted_mb", 256) * (1 << 20))
        self.max_concurrent_snapshots = int(o.get("max_concurrent_snapshots") or 1)
        self.max_out_mem = int(o.get("max_output_log_mb", 64) * (1 << 20))
        self.threshold = o.get("replay_threshold_records")
        self.cut_steps = 0
        self.span_reason: str | None = None
        self.span_steps = 0
        self.span_records = 0
        self.span_s = 0.0
        self.span_parts: dict = {}
        self.spilled_frames = 0
        self.store: Any = None
        self.inputs: Any = None
        self.input_logs: list[InputLog] = []
        self.w: Any = None
        self.stall_s = 0.0
        self.snapshots = 0
        self.snapshot_bytes = 0
        self.replayed_steps = 0
        self.replayed_records = 0
        self.read_restored = 0
        self.dropped_frames = 0
        self.lineage_frames = 0
        self.recovered = False
        self.restore_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self.step = 0
        self.stash = Stash()
        self.produced: dict[int, int] = {}
        self.consumed: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.fps: dict[int, dict[int, int]] = {}
        self.outlog: dict[int, deque] = {}
        """Per destination, [chan_seq, frame] items; the frame None once spilled."""
        self.out_mem = 0
        self.spillable: deque = deque()
        """(snapshot step, item) of the frames each snapshot wrote, in order."""
        self.new_out: list = []
        self.new_out_bytes = 0
        """Bytes of the frames in `new_out`: in memory, in no snapshot yet."""
        self.trimmed: list = []
        self.up: dict[int, bool] = {}
        self.resumed: dict[int, bool] = {}
        self.resume_from: dict[int, int] = {}
        self.lineage_attempt: dict[int, int | None] = {}
        """Per peer, the attempt whose LINEAGE frame set `resumed` and `resume_from`."""
        self.pending: list[tuple[int, dict, int]] = []
        self.durable_step = -1
        self.unpersisted = 0
        self.last_snapshot = time.monotonic()
        self.snapshot_step = -1
        self.kept: deque = deque(maxlen=RETENTION + 1)
        """The steps of the latest snapshots, for the store's retention window."""
        self.pc_epochs: dict[str, dict[int, int]] = {}
        self.safe = -1
        self.queue: dict[int, deque] = {}
        self.replaying = False
        self._stall_from: float | None = None
        self.last_cut = 0
        self.peer_consumed: dict[int, int] = {}
        """Per peer, the frames of the link to it that it had consumed when it (re)connected."""
        self.peer_points: dict[int, dict] = {}
        self.span_done: dict | None = None

    # -- the log of steps ---------------------------------------------------------------

    def _log(self, entry: tuple) -> None:
        self.step += 1
        self.stash.add(self.w.index, [(self.step, entry)])

    def poll_source(self, worker: Any, source: Any) -> bool:
        e = source.time_epoch() if worker.epoch_ms else None
        self._log(("s", worker.sources.index(source), e))
        return source.poll(e)

    def flush_routers(self, worker: Any) -> None:
        linger = worker.linger_s
        for ri, r in enumerate(worker.routers):
            for d in r.due(linger):
                self._log(("f", ri, d))
                r._send(d)

    def send_frame(self, worker: Any, dest: int, kind: int, header: dict, data: bytes) -> None:
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
        item = [seq, frame]
        self.outlog.setdefault(dest, deque()).append(item)
        self.out_mem += len(frame)
        self.new_out.append((dest, item))
        self.new_out_bytes += len(frame)
        if self.up.get(dest):
            worker.out[dest].send(frame)

    def _take_lineage(self, header: dict) -> None:
        lin = header.get("lin")
        if lin:
            me = self.w.index
            for origin, entries in lin.items():
                if origin != me:
                    self.stash.add(int(origin), entries)

    def accept_frame(self, worker: Any, j: int, f: Any) -> bool:
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
            return False
        self._consume(j, seq, h)
        return True

    def _consume(self, j: int, seq: int, h: dict) -> None:
        self._log(("i", j, seq))
        self.consumed[j] = seq
        self.fps.setdefault(j, {})[seq] = h.get("fp")

    def drain(self, worker: Any) -> None:
        """Processes frames queued while replaying, link by link."""
        for j in list(self.queue):
            q = self.queue[j]
            while q:
                f = q.popleft()
                self._consume(j, f.header["s"], f.header)
                worker.process_frame(j, f)
        self.queue = {}

    # -- links with peers ----------------------------------------------------------------

    def _lineage_frame(self, peer: int) -> bytes:
        self.stash.reset_marks(peer)
        lin = {o: self.stash.entries(o) for o in self.stash.origins() if o != self.w.index}
        return frames.encode(frames.LINEAGE, {"resume": self.consumed.get(peer, 0) + 1}, {"lin": lin, "for": peer})

    def _on_lineage(self, worker: Any, j: int, f: Any) -> None:
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

    def _try_resume(self, worker: Any, j: int) -> None:
        """Sends peer `j` its frames again from where it asked, once connected to the attempt
        that asked (its LINEAGE frame can arrive before the loss of an earlier attempt is
        known here, while the sending connection still goes to that one)."""
        conn = worker.out.get(j)
        if conn is None or j not in self.resume_from:
            return
        if getattr(conn, "attempt", None) != self.lineage_attempt.get(j):
            return  # "peer_back" opens the connection to the attempt that asked, and resumes
        start = self.resume_from.pop(j)
        log_ = self.outlog.get(j, deque())
        if log_ and log_[0][0] > start:
            raise RunFailed(
                f"worker {worker.index}: worker {j} asks for frames from {start}, the output log starts at {log_[0][0]}"
            )
        if not log_ and self.produced.get(j, 0) >= start:
            raise RunFailed(
                f"worker {worker.index}: worker {j} asks for frames from {start}, the output log is trimmed "
                f"up to {self.produced.get(j, 0)}"
            )
        for seq, frame in log_:
            if seq >= start:
                conn.send(frame if frame is not None else self.store.get((OUT, j, seq)))
        self.up[j] = True

    def on_peer_down(self, worker: Any, peer: int, attempt: int | None = None) -> None:
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
            self.received[peer] = self.consumed.get(peer, 0)

    def on_peer_connected(self, worker: Any, peer: int, conn: Any, direction: str) -> None:
        pass  # the LINEAGE frame goes on the sending connection, opened on "peer_back"

    def on_control(self, worker: Any, message: dict) -> None:
        op = message.get("op")
        if op == "points":
            self._on_points(worker, message)
        elif op == "lost":
            j = int(message["worker"])
            if j != worker.index:
                # the connections of the lost attempt go (not one a new attempt already opened)
                worker.peer_down(j, int(message.get("attempt", 0)))
        elif op == "span_done":
            self.span_done = message  # `_span` checks that it is its own job's
        elif op == "snapshot_now":
            if int(message.get("worker", -1)) != worker.index:
                self.last_snapshot = 0.0  # a recovering peer waits for our durable point
        elif op == "peer_back":
            j = int(message["worker"])
            if j == worker.index:
                return
            self.up[j] = False
            conn = worker.connect_peer(j, list(message["address"]), int(message.get("attempt", 0)))
            conn.send_uncounted(self._lineage_frame(j))
            self._try_resume(worker, j)

    def _on_points(self, worker: Any, message: dict) -> None:
        me = worker.index
        points = {int(w): p for w, p in message["points"].items()}
        self.peer_points = points
        for w, p in points.items():
            if w != me:
                self.stash.trim(w, int(p["step"]))
                upto = int(p["consumed"].get(me, 0))
                q = self.outlog.get(w)
                while q and q[0][0] <= upto:
                    item = q.popleft()
                    if item[1] is not None:
                        self.out_mem -= len(item[1])
                        item[1] = None
                    self.trimmed.append((w, item[0]))
                prod = int(p["produced"].get(me, 0))
                fp = self.fps.get(w)
                if fp:
                    for s in [s for s in fp if s <= prod]:
                        del fp[s]
        self.safe = int(message.get("safe", -1))
        self._commit_safe(worker)

    def _commit_safe(self, worker: Any) -> None:
        for s in worker.sinks:
            epochs = self.pc_epochs.get(s.name, {})
            upto = None
            for c, _ in s.precommitted:
                if c <= self.durable_step and epochs.get(c, EOS) <= self.safe:
                    upto = c
                else:
                    break
            if upto is not None:
                s.commit_checkpoint(upto)
                for c in [c for c in epochs if c <= upto]:
                    del epochs[c]

    # -- snapshots ------------------------------------------------------------------------

    def _not_durable(self) -> int:
        """Bytes not durable yet: of the snapshots under way, and of the frames sent since the
        last snapshot (which the next one will carry)."""
        return self.unpersisted + self.new_out_bytes

    def _under_way(self) -> int:
        """This process's snapshots the persister is not done with: not durable on the tier, or
        not indexed (still in memory)."""
        done = min(self.store.durable(self.tier), self.store.indexed)
        n = 0
        for k in reversed(self.kept):
            if k <= done:
                break
            n += 1
        return n

    def may_read(self, worker: Any) -> bool:
        if self._not_durable() <= self.max_unpersisted:
            if self._stall_from is not None:
                self.stall_s += time.perf_counter() - self._stall_from
                self._stall_from = None
            return True
        if self._stall_from is None:
            self._stall_from = time.perf_counter()
        return False

    def _frontier(self, worker: Any) -> int:
        # a loop's body runs inside its iterate operator's step and gets no markers: the
        # iterate operator's frontier stands for it
        return min((op.frontier for op in worker.ops if not op.node.params.get("loop_internal")), default=-1)

    def _cut(self, worker: Any) -> None:
        """Flushes every exchange buffer (a logged step); with a replay threshold, then logs the
        frame counters per link (a cut a recovery can hand the steps before to a batch job)."""
        self._log(("F",))
        for r in worker.routers:
            r.flush()
        if self.cut_steps:
            self._log(("C", [self.produced.get(d, 0) for d in range(worker.workers)]))
        self.last_cut = self.step

    def _snapshot(self, worker: Any) -> None:
        self._cut(worker)
        k = self.step
        for s in worker.sinks:
            if s.part.has_staged():
                s.precommit(k)
                self.pc_epochs.setdefault(s.name, {})[k] = s.last_epoch
        updates: list = []
        for i, op in enumerate(worker.ops):
            if isinstance(op, JoinOp):
                # the sides of a join only grow: their new values, each once
                updates.extend(((i, key, side, x), v) for key, side, x, v in op.take_increments())
            elif isinstance(op, KeyedOp):
                updates.extend(((i, key), v) for key, v in op.take_updates())
        updates.extend(((OUT, d, item[0]), item[1]) for d, item in self.new_out)
        self.spillable.extend((k, item) for _, item in self.new_out)
        updates.extend(((OUT, d, seq), TOMBSTONE) for d, seq in self.trimmed)
        self.new_out, self.trimmed = [], []
        self.new_out_bytes = 0
        meta = {
            "step": k,
            "ops": {op.name: op.snapshot_meta() for op in worker.ops},
            "produced": self.produced,
            "consumed": self.consumed,
            "stash": {o: self.stash.entries(o) for o in self.stash.origins() if o != worker.index},
            "pc_epochs": self.pc_epochs,
            "frontier": self._frontier(worker),
        }
        updates.append((META, _pack(meta)))
        self.kept.append(k)
        if len(self.kept) > RETENTION:
            # compaction keeps every version of the last RETENTION snapshots (seq = step);
            # narrowed before the append, so no compaction sees the new seq with the old window
            self.store.options.retention = k - self.kept[0]
        size = self.store.append(k, updates)
        self.store.persist(self.tier)
        self.unpersisted += size
        self.snapshots += 1
        self.snapshot_bytes += size
        point = {
            "step": k,
            "frontier": meta["frontier"],
            "consumed": dict(self.consumed),
            "produced": dict(self.produced),
        }
        self.pending.append((k, point, size))
        self.snapshot_step = k
        self.last_snapshot = time.monotonic()

    def poll(self, worker: Any) -> None:
        now = time.monotonic()
        if worker.sinks:
            ended = all(s.frontier == EOS for s in worker.sinks)
        else:
            ended = all(s.finished for s in worker.sources)
        # Invariant: at most max_concurrent_snapshots are under way (the persister not done with
        # them: durable on the tier and indexed). A snapshot taken while the persister still
        # works on the one before only queues behind it: it makes no recovery shorter (a
        # recovery restores the last durable snapshot), and each writes every key changed since
        # the last, so a persister that falls behind would fall further behind, competing with
        # processing for the same core. Waiting lets the dirty keys coalesce instead: the
        # interval between snapshots grows to what persisting takes (as abs's max concurrent
        # checkpoints do).
        if (
            self.step > self.snapshot_step
            and (now - self.last_snapshot >= self.persist_s or ended or self._not_durable() > self.max_unpersisted)
            and self._under_way() < self.max_concurrent_snapshots
        ):
            self._snapshot(worker)
        elif self.cut_steps and self.step - self.last_cut >= self.cut_steps:
            self._cut(worker)
        if self.pending:
            durable = self.store.durable(self.tier)
            while self.pending and self.pending[0][0] <= durable:
                k, point, size = self.pending.pop(0)
                self.unpersisted -= size
                self.durable_step = k
                self.stash.trim(worker.index, k)
                worker.send_ctrl({"type": "mode", "op": "durable", "gen": worker.gen, "point": point})
            if self.out_mem > self.max_out_mem:
                self._spill()
            if self.pending and self.store.error is not None:
                log.warning("worker %s: persisting: %s", worker.index, self.store.error)

    def _spill(self) -> None:
        """Drops from memory the oldest output-log frames a durable snapshot holds, until the
        output log is within its bound (or nothing durable is left to drop)."""
        q = self.spillable
        while q and q[0][0] <= self.durable_step and self.out_mem > self.max_out_mem // 2:
            _, item = q.popleft()
            if item[1] is not None:
                self.out_mem -= len(item[1])
                item[1] = None
                self.spilled_frames += 1
        while q and q[0][1][1] is None:
            q.popleft()  # trimmed meanwhile

    def can_finish(self, worker: Any) -> bool:
        return (
            self.snapshot_step == self.step
            and not self.pending
            and not any(s.uncommitted for s in worker.sinks)
            and all(self.resumed.get(j) for j in worker.out)
        )

    # -- restore and replay ---------------------------------------------------------------

    def _open_store(self, worker: Any) -> None:
        if self.store is not None:
            return
        path = store_path(worker.spec["run_dir"], worker.index)
        # every version until RETENTION snapshots were taken (`_snapshot` narrows it)
        self.store = open_store(worker, path, f"the nosync log {path}", retention=1 << 62)

    def on_start(self, worker: Any, peers: dict) -> None:
        self.w = worker
        self._reset()
        if self.threshold:
            from nosync.modes.nosync_span import eligible

            self.span_reason = eligible(worker.plan)
            if self.span_reason is not None:
                self.span_reason = f"the pipeline is not eligible: {self.span_reason}"
            else:
                # a cut every quarter of the threshold (64 steps at least: a cut's entry is
                # bigger than the others, and frame headers carry a bounded number of entries)
                self.cut_steps = max(64, int(self.threshold) // (4 * worker.batch_size))
        for op in worker.ops:
            if isinstance(op, JoinOp):
                op.incremental = True
                op.track_dirty = False
        self._open_store(worker)
        self.input_logs = []
        for i, src in enumerate(worker.sources):
            if not src.source.replayable:
                if self.inputs is None:
                    path = input_store_path(worker.spec["run_dir"], worker.index)
                    self.inputs = open_store(worker, path, f"the input log {path}", retention=0)
                src.source = InputLog(src.source, i, self.inputs, self.tier)
                self.input_logs.append(src.source)
        restore = bool(peers.get("restore")) or worker.attempt > 0
        self.alone = bool(peers.get("alone"))
        for j in worker.out:
            self.up[j] = False
        if not restore:
            for j in worker.out:
                self.up[j] = True
                self.resumed[j] = True
            return
        t0 = time.perf_counter()
        self._restore(worker)
        self.read_restored = sum(s.records_in for s in worker.sources)
        self.recovered = True
        # one LINEAGE frame each way with every peer, then replay what they hold for us
        for j, conn in worker.out.items():
            conn.send_uncounted(self._lineage_frame(j))
        self._replay(worker)
        self.restore_s = time.perf_counter() - t0
        worker.send_ctrl(
            {
                "type": "mode",
                "op": "replayed",
                "gen": worker.gen,
                "restored_step": self.durable_step,
                "steps": self.replayed_steps,
                "records": self.replayed_records,
                "read_restored": self.read_restored,
                "restore_s": self.restore_s,
                "span_steps": self.span_steps,
                "span_records": self.span_records,
                "span_s": self.span_s,
                "span_parts": self.span_parts,
                "span_reason": self.span_reason,
            }
        )

    def _restore(self, worker: Any) -> None:
        store = self.store
        k = store.last_seq
        raw = store.get(META) if k >= 0 else None
        if raw is None:
            # nothing durable yet: start over from the sources' beginnings, without the files
            # a pre-commit left in staging before its snapshot could become durable
            for op in worker.ops:
                if isinstance(op, SinkOp):
                    op.part.recover(-1, [])
            return
        meta = _unpack(raw)
        self.step = self.snapshot_step = self.durable_step = int(meta["step"])
        self.produced = {int(d): int(s) for d, s in meta["produced"].items()}
        self.consumed = {int(j): int(s) for j, s in meta["consumed"].items()}
        self.received = dict(self.consumed)
        for origin, entries in meta["stash"].items():
            self.stash.add(int(origin), entries)
        self.pc_epochs = {n: {int(c): int(e) for c, e in d.items()} for n, d in meta["pc_epochs"].items()}
        for (_, d, seq), _ in store.scan((OUT,)):
            # left in the store (spilled): read back only if a peer asks for it again
            self.outlog.setdefault(int(d), deque()).append([int(seq), None])
        metas = meta["ops"]
        for i, op in enumerate(worker.ops):
            m = metas.get(op.name)
            if m is not None:
                op.restore_meta(m)
            if isinstance(op, WindowOp):
                op.restore_keyed(((key[1], v) for key, v in store.scan((i,))), worker.keepalive)
            elif isinstance(op, JoinOp):
                op.lazy(lambda key, i=i: _join_sides(self.store.scan((i, key))), raw=True)
            elif isinstance(op, KeyedOp):
                op.lazy(lambda key, i=i: self.store.get((i, key), default=MISSING_STATE))
            if isinstance(op, SinkOp):
                pre = [(int(c), h) for c, h in (m["precommitted"] if m is not None else ())]
                op.part.recover(k, [])
                op.precommitted = pre
                op.committed = m["committed"] if m is not None else 0
            worker.keepalive()

    def _replay(self, worker: Any) -> None:
        """Waits for a LINEAGE frame from every peer, then re-executes the logged steps after
        the snapshot, in their order."""
        import selectors

        self.replaying = True
        me = worker.index
        sel = selectors.DefaultSelector()
        for j, c in worker.inc.items():
            sel.register(c.sock, selectors.EVENT_READ, ("in", j, c))
        for j, c in worker.out.items():
            sel.register(c.sock, selectors.EVENT_READ, ("out", j, c))
        sel.register(worker.ctrl_conn.sock, selectors.EVENT_READ, ("ctrl", -1, None))
        deadline = [time.monotonic() + REPLAY_TIMEOUT_S]

        def pump(wait: float) -> None:
            for key, _ in sel.select(wait):
                kind, j, conn = key.data
                if kind == "ctrl":
                    worker._read_ctrl()
                    continue
                try:
                    got = conn.receive()
                except ConnectionError as e:
                    from nosync.errors import PeerLost

                    raise PeerLost(f"worker {me}: worker {j} went away during a replay: {e}") from e
                for f in got:
                    if kind == "out":
                        if f.kind == frames.CREDIT:
                            conn.grant(int(f.header.get("frames", 0)))
                    elif f.kind == frames.LINEAGE:
                        self._on_lineage(worker, j, f)
                    else:
                        worker._handle_data(j, f)
            for c in [*worker.out.values(), *worker.inc.values()]:
                if c.out_bytes and not c.closed:
                    c.flush()
            worker.keepalive()
            if worker._rejoin is not None:
                from nosync.worker import Rejoin

                raise Rejoin(worker._rejoin)
            if time.monotonic() > deadline[0]:
                raise RunFailed(f"worker {me}: replay not done after {REPLAY_TIMEOUT_S:.0f}s")

        try:
            while not all(self.resumed.get(j) for j in worker.inc):
                pump(0.05)
            # the plan checks the lineage against the snapshot: frames of each link consumed
            # in order, none the snapshot had already consumed
            point = {"step": self.step, "consumed": self.consumed, "produced": self.produced}
            try:
                plan = recovery_plan({me}, {me: point}, {me: [self.stash.entries(me)]}, worker.workers)[me]
            except LineageError as e:
                raise RunFailed(f"worker {me}: the lineage its peers hold cannot be replayed: {e}") from e
            entries = plan["replay"]
            if self.threshold and self.alone:
                taken = self._span(worker, entries, pump)
                deadline[0] = time.monotonic() + REPLAY_TIMEOUT_S
                entries = entries[taken:]
            elif self.threshold and self.span_reason is None:
                self.span_reason = "every worker restored (a regroup): the span job is for one worker recovering alone"
            for _, entry in entries:
                kind = entry[0]
                if kind == "i":
                    j, seq = int(entry[1]), int(entry[2])
                    f = self._next_frame(j, seq, pump)
                    self._consume(j, seq, f.header)
                    if f.kind == frames.DATA:
                        self.replayed_records += len(f.body)
                    worker.process_frame(j, f)
                elif kind == "s":
                    self._log(tuple(entry))
                    src = worker.sources[int(entry[1])]
                    before = src.records_in
                    src.poll(entry[2])
                    self.replayed_records += src.records_in - before
                elif kind == "f":
                    self._log(tuple(entry))
                    worker.routers[int(entry[1])]._send(int(entry[2]))
                elif kind == "F":
                    self._log(("F",))
                    for r in worker.routers:
                        r.flush()
                elif kind == "C":
                    self._log(tuple(entry))
                    now = [self.produced.get(d, 0) for d in range(worker.workers)]
                    if list(entry[1]) != now:
                        raise RunFailed(
                            f"worker {me}: replay reached a cut with frame counters {now}, the run had "
                            f"{list(entry[1])}: an operator is not deterministic given its input order"
                        )
                self.replayed_steps += 1
                if self.replayed_steps & 0xFF == 0:
                    pump(0)
        finally:
            sel.close()
            self.replaying = False
        self.drain(worker)

    def _next_frame(self, j: int, seq: int, pump: Any) -> Any:
        """Frame `seq` of the link from worker `j`, the next in its queue once it arrived."""
        q = self.queue.setdefault(j, deque())
        while not q:
            pump(0.05)
        f = q.popleft()
        if f.header["s"] != seq:
            raise RunFailed(f"worker {self.w.index}: replay expected frame {seq} from worker {j}, got {f.header['s']}")
        return f

    def _span(self, worker: Any, entries: list, pump: Any) -> int:
        """With a replay threshold: when the span to re-execute holds more records than it,
        hands the steps up to its last usable cut to a Spark batch job (`nosync_span`) and
        loads what the job computed. Returns how many of `entries` that covered (0: none; the
        reason is kept in `span_reason`)."""
        import shutil

        from lsm.files import copy_store
        from nosync.modes import nosync_span

        me, W = worker.index, worker.workers
        if self.cut_steps == 0:
            return 0  # the pipeline is not eligible: `span_reason` says why
        # the records the span reads again and takes from peers, a full chunk per step at most
        size = sum(1 for _, e in entries if e[0] in ("s", "i")) * worker.batch_size
        if size <= int(self.threshold):
            self.span_reason = f"the span ({size:,} records at most) is within the threshold"
            return 0
        cut = None
        for x, (_, e) in enumerate(entries):
            if e[0] == "C" and all(int(e[1][j]) <= self.peer_consumed.get(j, 0) for j in range(W) if j != me):
                cut = x
        if cut is None:
            self.span_reason = "the span holds no cut whose frames every survivor had consumed"
            return 0
        t0 = time.perf_counter()
        counters = [int(c) for c in entries[cut][1][1]]
        taken = entries[: cut + 1]
        # the frames of the span, per link, and for the job in the order the steps consumed them
        got: dict[int, list] = {}
        inputs = []
        for _, e in taken:
            if e[0] == "i":
                j = int(e[1])
                f = self._next_frame(j, int(e[2]), pump)
                worker.credit(j)  # held here, not in the link's window
                got.setdefault(j, []).append(f)
                inputs.append((j, f.kind, f.header, f.body))

        def give_back() -> None:
            for j, fs in got.items():
                self.queue[j].extendleft(reversed(fs))

        spans = os.path.join(worker.spec["run_dir"], "span")
        for old in os.listdir(spans) if os.path.isdir(spans) else ():
            if old.startswith(f"w{me}-"):
                shutil.rmtree(os.path.join(spans, old), ignore_errors=True)  # a lost attempt's
        job_dir = os.path.join(spans, f"w{me}-a{worker.attempt}-s{self.step}")
        os.makedirs(job_dir)
        with open(os.path.join(job_dir, "span.msgpack"), "wb") as out:
            out.write(_pack({"restore_step": self.step, "entries": taken, "frames": inputs}))
        t1 = time.perf_counter()
        # the job reads the store at the snapshot from a copy, made while nobody writes it
        path = self.store.path
        self.store.close()
        try:
            copy_store(path, os.path.join(job_dir, "base"))
        finally:
            self.store = None
            self._open_store(worker)
        t2 = time.perf_counter()
        covered = self._covered(counters)
        if not covered:
            worker.send_ctrl({"type": "mode", "op": "cover", "gen": worker.gen})
        self.span_done = None
        worker.send_ctrl(
            {
                "type": "mode",
                "op": "span",
                "gen": worker.gen,
                "dir": job_dir,
                "tasks": W,
                "step": self.step,
            },
        )
        while self.span_done is None or self.span_done.get("dir") != job_dir:
            pump(0.05)
            covered = covered or self._covered(counters)
        done, self.span_done = self.span_done, None
        why = done.get("error")
        t3 = waited = time.perf_counter()
        while why is None and not covered:
            if time.perf_counter() - waited > COVER_TIMEOUT_S:
                why = f"the survivors' durable points did not cover the cut within {COVER_TIMEOUT_S:.0f}s"
                break
            pump(0.05)
            covered = self._covered(counters)
        result = None
        if why is None:
            try:
                ordered = {op.name for op in worker.sinks if op.part.order_matters}
                result = nosync_span.load_results(job_dir, W, ordered)
            except Exception as e:  # noqa: BLE001 - the worker re-executes the span itself
                why = f"{type(e).__name__}: {e}"
        if result is None:
            log.warning("worker %s: the span job is not used (%s): re-executing record by record", me, why)
            self.span_reason = f"the span job was not used: {why}"
            give_back()
            shutil.rmtree(job_dir, ignore_errors=True)
            return 0
        t4 = time.perf_counter()
        self._apply_span(worker, taken, counters, got, result)
        shutil.rmtree(job_dir, ignore_errors=True)
        t5 = time.perf_counter()
        self.span_s += t5 - t0
        # where the time went: the span's frames gathered and written, the store copied, the
        # job (as the driver timed it, and as waited for here), the survivors' cover, loading
        self.span_parts = {
            "gather_s": t1 - t0,
            "copy_s": t2 - t1,
            "job_s": float(done.get("seconds", 0.0)),
            "wait_s": t3 - t2,
            "cover_s": t4 - t3,
            "load_s": t5 - t4,
        }
        self.span_reason = None
        return len(taken)

    def _covered(self, counters: list) -> bool:
        """Whether every survivor's durable point covers the frames produced up to the cut."""
        me = self.w.index
        for j, c in enumerate(counters):
            if j != me and c > int((self.peer_points.get(j) or {}).get("consumed", {}).get(me, 0)):
                return False
        return True

    def _apply_span(self, worker: Any, taken: list, counters: list, got: dict, result: dict) -> None:
        """The worker as it stood after the last step of `taken` (a cut): the job's keyed state,
        frontiers, source positions and sink records, and the counters of the steps."""
        me = worker.index
        for i, items in result["keyed"].items():
            op = worker.ops[i]
            looked = getattr(op, "looked", None)
            for k, v, deleted in items:
                if deleted:
                    op.state.pop(k, None)
                else:
                    op.state[k] = statecodec.unpack(v) if type(v) is bytes else v
                op.dirty.add(k)
                if looked is not None:
                    looked.add(k)
        metas = result["meta"]
        for op in worker.ops:
            m = metas.get(op.name)
            if m is None:
                continue
            if isinstance(op, SinkOp):
                Op.restore_meta(op, m)  # its pre-commits and commits stay the snapshot's
            else:
                op.restore_meta(m)
        worker.clock.ts = 0.0  # records staged here have no ingest time to measure from
        for op in worker.sinks:
            for epoch, recs in result["sinks"].get(op.name, ()):
                op.records_in += len(recs)
                op.process(list(recs), epoch, None)
            if op.frontier >= 0:
                op.part.seal(op.frontier)
        for _, entry in taken:
            if entry[0] == "i":
                self.consumed[int(entry[1])] = int(entry[2])
        for j, fs in got.items():
            fp = self.fps.setdefault(j, {})
            for f in fs:
                fp[f.header["s"]] = f.header.get("fp")
        self.stash.add(me, [(int(step), tuple(entry)) for step, entry in taken])
        self.step = int(taken[-1][0])
        self.produced = {d: c for d, c in enumerate(counters) if d != me and c}
        for d, q in self.outlog.items():
            # produced before the cut: every receiver's durable point covers them
            while q and q[0][0] <= self.produced.get(d, 0):
                item = q.popleft()
                if item[1] is not None:
                    self.out_mem -= len(item[1])
                    item[1] = None
                self.trimmed.append((d, item[0]))
        self.replayed_steps += len(taken)
        self.span_steps += len(taken)
        self.span_records += int(result["read"]) + sum(
            len(f.body) for fs in got.values() for f in fs if f.kind == frames.DATA
        )

    def debug_state(self, worker: Any) -> dict:
        return {
            "step": self.step,
            "snapshot_step": self.snapshot_step,
            "durable_step": self.durable_step,
            "pending": [k for k, _, _ in self.pending],
            "safe": self.safe,
            "replaying": self.replaying,
            "up": self.up,
            "resumed": self.resumed,
            "resume_from": self.resume_from,
            "received": self.received,
            "consumed": self.consumed,
            "produced": self.produced,
            "queued": {j: len(q) for j, q in self.queue.items()},
            "outlog": {j: [q[0][0], q[-1][0], len(q)] if q else [] for j, q in self.outlog.items()},
            "sinks_uncommitted": [s.name for s in worker.sinks if s.uncommitted],
        }

    def metrics(self, worker: Any) -> dict:
        stall = self.stall_s
        if self._stall_from is not None:
            stall += time.perf_counter() - self._stall_from
        return {
            "steps": self.step,
            "snapshots": self.snapshots,
            "snapshot_bytes": self.snapshot_bytes,
            "persist_stall_s": stall,
            "replayed_steps": self.replayed_steps,
            "dropped_frames": self.dropped_frames,
            "lineage_frames": self.lineage_frames,
            "restore_s": self.restore_s,
            "output_log_frames": sum(len(q) for q in self.outlog.values()),
            "output_log_bytes": self.out_mem,
            "output_log_spilled_frames": self.spilled_frames,
            "lineage_entries": sum(len(self.stash.entries(o)) for o in self.stash.origins()),
            "input_logged_records": sum(x.logged_records for x in self.input_logs),
            "input_log_s": sum(x.log_s for x in self.input_logs),
        }

    def close(self, worker: Any) -> None:
        for store in (self.store, self.inputs):
            if store is not None:
                try:
                    store.close()
                except Exception:  # noqa: BLE001 - closing after a failure must not hide it
                    log.exception("closing %s", store.path)
        self.store = self.inputs = None


def _join_sides(items: Any) -> Any:
    """The sides of one join key from its logged increments ((op, key, side, index), value),
    which a scan returns in index order."""
    sides: tuple[list, list] = ([], [])
    found = False
    for (_, _, side, _), v in items:
        sides[side].append(statecodec.unpack(v) if type(v) is bytes else v)
        found = True
    return sides if found else MISSING_STATE


# -- the driver half -------------------------------------------------------------------


class NosyncMode(Mode):
    """Collects durable points, broadcasts them with the safe point, and recovers a lost
    worker alone (every worker, when a second one is lost meanwhile)."""

    name = "nosync"
    hooks_class = NosyncHooks
    requires_replayable_sources = False  # the input log makes the others replayable

    def __init__(self, options: dict | None = None) -> None:
        super().__init__(options)
        self.resume = bool(self.options.get("resume"))
        self.points: dict[int, dict] = {}
        self.changed = False
        self.safe = -1
        self.safe_rows: list[dict] = []
        self.recovering: dict[int, dict] = {}
        self.recoveries: list[dict] = []
        self.last_broadcast = 0.0
        self.last_sample = 0.0
        self.progress_rows: list[dict] = []
        self.threshold = self.options.get("replay_threshold_records")
        self.spark: Any = None
        self.spec: dict = {}
        self.span_results: list[tuple[int, int, dict]] = []
        """(worker, generation, result) of span jobs done, for `tick` to hand over."""

    def attach(self, spark: Any, spec: dict) -> None:
        self.spark, self.spec = spark, spec
        if self.threshold:
            from nosync.batch import warm_up_soon

            warm_up_soon(spark, spec["workers"], "span")

    def _span_job(self, worker: int, gen: int, msg: dict) -> None:
        from nosync.modes.nosync_span import run_span

        try:
            got = run_span(self.spark, self.spec, {"worker": worker, "dir": msg["dir"], "tasks": msg["tasks"]})
            result = {"seconds": got["seconds"], "dir": msg["dir"]}
        except Exception as e:  # noqa: BLE001 - the worker re-executes the span itself
            log.warning("the span job of worker %s failed", worker, exc_info=True)
            result = {"error": f"{type(e).__name__}: {e}"[:2000], "dir": msg["dir"]}
        self.span_results.append((worker, gen, result))

    def worker_options(self) -> dict:
        o = self.options
        return {
            "persist_tier": o.get("persist_tier") or o.get("checkpoint_tier") or "disk",
            "persist_ms": o.get("persist_ms") or 200,
            "max_unpersisted_mb": o.get("max_unpersisted_mb") or 256,
            "max_output_log_mb": o.get("max_output_log_mb") or 64,
            "max_concurrent_snapshots": o.get("max_concurrent_snapshots") or 1,
            "replay_threshold_records": o.get("replay_threshold_records"),
        }

    def on_message(self, coord: Any, worker: int, msg: dict) -> None:
        if msg.get("op") == "span":
            import threading

            coord.event("span_job", worker=worker, step=int(msg.get("step", 0)))
            threading.Thread(
                target=self._span_job, args=(worker, coord.gen, msg), name="nosync-span", daemon=True
            ).start()
            return
        if msg.get("op") == "cover":
            coord.broadcast({"type": "mode", "op": "snapshot_now", "worker": worker, "gen": coord.gen})
            # and the points as they stand: a restarted worker has seen none, and survivors
            # whose input ended take no snapshot that would broadcast them again
            self.changed = True
            return
        if msg.get("op") == "replayed":
            for r in reversed(self.recoveries):
                if r["worker"] == worker or r.get("global"):
                    # records its sources read again: as far as they had read when it was lost
                    # (its last heartbeat), from its snapshot's positions
                    r.setdefault("records_replayed", 0)
                    r["records_replayed"] += int(msg["records"])
                    # (a lower bound: the heartbeat may be older than the snapshot restored)
                    r["records_reprocessed"] = max(
                        r.get("read_at_loss", 0) - int(msg["read_restored"]), r["records_replayed"]
                    )
                    r.setdefault("steps_replayed", 0)
                    r["steps_replayed"] += int(msg["steps"])
                    r["replay_restore_s"] = max(r.get("replay_restore_s", 0.0), float(msg["restore_s"]))
                    if self.threshold:
                        r["span_steps"] = int(msg.get("span_steps", 0))
                        r["span_records"] = int(msg.get("span_records", 0))
                        r["span_s"] = float(msg.get("span_s", 0.0))
                        r["span_reason"] = msg.get("span_reason")
                        r["span_parts"] = msg.get("span_parts") or {}
                    r["restored_step"] = int(msg["restored_step"])
                    break
            return
        if msg.get("op") != "durable":
            return
        p = msg["point"]
        old = self.points.get(worker)
        if old is None or p["step"] >= old["step"]:
            self.points[worker] = p
            self.changed = True

    def tick(self, coord: Any) -> None:
        while self.span_results:
            w, gen, result = self.span_results.pop(0)
            if gen == coord.gen:
                coord.send(w, {"type": "mode", "op": "span_done", "gen": gen, **result})
        now = time.monotonic()
        if now - self.last_sample >= 0.25:
            # per-worker progress over time: what a recovery cost the workers that did not fail
            self.last_sample = now
            t = time.time()
            for w, c in sorted(coord.counters.items()):
                self.progress_rows.append(
                    {"t": t, "worker": w, "read": int(c.get("read", 0)), "committed": int(c.get("committed", 0))}
                )
        if not self.changed or now - self.last_broadcast < 0.05:
            return
        self.changed = False
        self.last_broadcast = now
        s = safe_point(self.points, coord.workers)
        if s > self.safe:
            self.safe = s
            self.safe_rows.append({"t": time.time(), "safe_point": s})
            coord.event("safe_point", epoch=s)
        coord.broadcast({"type": "mode", "op": "points", "points": self.points, "safe": self.safe, "gen": coord.gen})

    def on_worker_lost(self, coord: Any, worker: int, attempt: int, reason: str) -> None:
        row = {
            "worker": worker,
            "attempt": attempt,
            "reason": reason,
            "lost_at": time.time(),
            "detection_s": coord.silent_s,
            "durable_step": self.points.get(worker, {}).get("step", 0),
            "read_at_loss": int(coord.counters.get(worker, {}).get("read", 0)),
        }
        self.recoveries.append(row)
        others = [w for w in self.recovering if w != worker]
        coord.ready.discard(worker)
        coord.done.pop(worker, None)
        if others or not coord.all_ready and len(coord.ready) < coord.workers - 1:
            # a second worker lost while one recovers: every worker restores its own snapshot
            row["global"] = True
            self.recovering = {}
            coord.regroup(f"worker {worker} (attempt {attempt}) was lost while worker(s) {others} recovered")
            return
        coord.regroups += 1
        if coord.max_restarts is not None and coord.regroups > coord.max_restarts:
            coord.fail(
                f"worker {worker} (attempt {attempt}) was lost: {reason}; the run already recovered "
                f"{coord.max_restarts} times (--max-restarts)"
            )
            return
        self.recovering[worker] = row
        coord.event("recovering", worker=worker)
        coord.broadcast({"type": "mode", "op": "lost", "worker": worker, "attempt": attempt, "gen": coord.gen})

    def on_rejoin(self, coord: Any, worker: int, attempt: int, address: list) -> None:
        peers = [coord.members[i] for i in range(coord.workers)]
        coord.send(worker, {"type": "peers", "gen": coord.gen, "addresses": peers, "restore": True, "alone": True})
        for w in range(coord.workers):
            if w != worker:
                coord.send(
                    w,
                    {
                        "type": "mode",
                        "op": "peer_back",
                        "worker": worker,
                        "attempt": attempt,
                        "address": address,
                        "gen": coord.gen,
                    },
                )

    def on_generation(self, coord: Any, gen: int) -> dict:
        if gen == 0 and not self.resume:
            return {}
        coord.event("restore", scope="every worker")
        return {"restore": True}

    def on_ready(self, coord: Any, worker: int, gen: int) -> None:
        # a worker that restored learns the safe point at the next tick, even when it will not
        # change again (a loss after the last safe point of the run: nothing else would send it)
        self.changed = True
        row = self.recovering.pop(worker, None)
        if row is not None:
            row["restored_at"] = time.time()
            row["restore_s"] = row["restored_at"] - row["lost_at"]
            coord.event("recovered", worker=worker, restore_s=round(row["restore_s"], 3))
        if coord.all_ready:
            for r in self.recoveries:
                if r.get("global") and "restored_at" not in r:
                    r["restored_at"] = time.time()
                    r["restore_s"] = r["restored_at"] - r["lost_at"]

    def summary(self, coord: Any) -> dict:
        per = [d.get("metrics", {}).get("mode", {}) for d in coord.done.values()]
        return {
            "stall_ms_max": max((m.get("persist_stall_s", 0.0) * 1000 for m in per), default=0.0),
            "checkpoint_bytes": sum(m.get("snapshot_bytes", 0) for m in per),
            "snapshots": sum(m.get("snapshots", 0) for m in per),
            "replayed_steps": sum(m.get("replayed_steps", 0) for m in per),
            "frames_dropped_as_replayed": sum(m.get("dropped_frames", 0) for m in per),
            "lineage_frames": sum(m.get("lineage_frames", 0) for m in per),
            "output_log_spilled_frames": sum(m.get("output_log_spilled_frames", 0) for m in per),
            "input_logged_records": sum(m.get("input_logged_records", 0) for m in per),
            "safe_point": self.safe,
            "safe_points": len(self.safe_rows),
            "recoveries": self.recoveries,
        }

    def tables(self) -> dict[str, list[dict]]:
        return {"safe_points": self.safe_rows, "progress": self.progress_rows}

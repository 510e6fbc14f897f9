"""Mode `abs`: asynchronous barrier snapshots (Carbone et al. 2015), as Flink does them.

Steady state. The driver's `CheckpointCoordinator` triggers checkpoint n every
`checkpoint_ms` (at most `max_concurrent` at once): every worker's sources record their
positions and emit barrier n, in-band, on all their outputs. An operator instance that gets
barrier n on one input blocks that input (what arrives on it is held, never dropped) until
barrier n has arrived on every input — alignment; an instance with one input never waits.
Then it snapshots: the keyed updates since its previous snapshot (changed keys, deleted keys
as tombstones) are appended to its `lsm` store at seq n — the synchronous part, a msgpack
copy of the changed values — and persisted by the store's background thread while processing
resumes at once; the rest of its state (frontiers, watermarks, window bookkeeping, source
positions) is a small map. Sinks pre-commit: what they staged goes durably into their staging
area. The instance forwards barrier n on all outputs and unblocks. A worker acknowledges n
once all its instances snapshotted it and their stores are durable on the configured tier
(disk, or remote). Checkpoint n completes when every worker has acknowledged: its metadata is
written atomically (`nosync/state/checkpoints.py`), then every sink commits what it pre-committed up
to n. A checkpoint not complete within `timeout_ms` is aborted and counted; a later one that
completes commits its pre-commits too. Once every worker's input is exhausted, a last
checkpoint is triggered at once, so the run ends as soon as its output is committed.

Recovery. A lost worker makes the coordinator start a new generation: every worker drops its
data connections and in-flight data, and all of them — the survivors in place, Spark's retry
of the lost task from scratch — restore the last completed checkpoint: keyed stores rolled
back to its seq and loaded, the rest from its metadata, sinks committing its pre-commits
(idempotently) and discarding later staging, sources rewound to its positions. A damaged
metadata file makes recovery fall back to the previous completed checkpoint, and say so
(sinks then retract output committed after it, so nothing is duplicated); a keyed snapshot
missing from its store, or a store that is corrupt, fails the run naming the file. `run
--resume RUN_DIR` restores the same way after the driver itself died.

Cycles. The dataflow's only cycles are `iterate` loops (`nosync.runtime.loops`). A loop head
snapshots when the barrier comes on the loop's input and sends it into the body; it logs what
arrives on its back channels until the barrier has come back round on each, and that log is
part of its snapshot, replayed into the loop on a restore (the ABS paper's treatment of
cycles: operator state on the acyclic part, a record log on the back edges). Nothing aligns
on a back edge, so a cycle cannot deadlock the barrier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from lsm import ValueEncodingError
from nosync import storage
from nosync.errors import RunFailed
from nosync.modes.base import Mode, persist_cpu, persist_share, workers_metrics
from nosync.options import RunOptions
from nosync.places import shared_of
from nosync.runtime import control
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.keyed import JoinOp
from nosync.runtime.loops import LoopHead
from nosync.runtime.operators import EOS, SinkOp
from nosync.state import checkpoints
from nosync.state.checkpoints import STATE, restore_keyed
from nosync.state.stores import open_store

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

log = logging.getLogger("nosync.abs")

RETENTION = 64
"""Checkpoint ids each keyed store keeps versions of: a rollback may go this far back."""
KEEP_FILES = RETENTION
"""Completed checkpoint files kept in the run directory: the newest, the fallbacks behind it,
and what `nosync rewind` can start from. As many as the stores keep versions of; with
aborted checkpoints between them, the oldest files can name versions already compacted,
which `rewind` finds out and says."""


class AbsOp(StrEnum):
    """What an abs mode message asks or says."""

    TRIGGER = "trigger"
    """coordinator -> workers: take checkpoint `n` (the sources snapshot and emit its barrier)."""
    ACK = "ack"
    """worker -> coordinator: its snapshots of checkpoint `n` are durable."""
    COMPLETE = "complete"
    """coordinator -> workers: checkpoint `n` is complete; the sinks commit it."""
    ABORT = "abort"
    """coordinator -> workers: checkpoint `n` was aborted."""


PERSIST_PARTS = ("snapshots", "store", "merges")
"""Where a worker's persistence CPU goes: its snapshots on the processing thread, its stores'
persisters (encoding, logging, indexing) and their merges."""


def take_keyed(op: Any) -> Any:
    """The keyed updates of `op` since its last snapshot, as `append` takes them (a join's:
    its increments, as columns)."""
    return op.take_increments() if isinstance(op, JoinOp) else op.take_updates()


# -- the worker half -------------------------------------------------------------------


class AbsHooks(WorkerHooks):
    """The worker half of mode abs: snapshots at aligned barriers into a keyed store per operator,
    acknowledges checkpoints once durable, and restores the last completed one."""

    name = "abs"
    sink_commits_at_frontier = False
    tracks_dirty = True
    recovers = True

    def __init__(self, options: RunOptions | Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.tier = self.options.checkpoint_tier
        self.stores: dict[str, Any] = {}
        self.pending: dict[int, dict] = {}
        self.aborted: set[int] = set()
        self.completed = -1
        """The newest checkpoint the coordinator said complete: the sinks commit up to it (a
        commit their fence deferred is made again from `poll`, `SinkOp.deferred`)."""
        self.align: dict[str, dict[int, dict]] = {}
        self.acked = 0
        self.snapshot_cpu_s = 0.0
        """The processing thread's time in snapshots (taking and encoding their state)."""
        self.worker: Worker = None

    # -- restore ---------------------------------------------------------------------

    def _open_stores(self, worker: Worker) -> None:
        for op in worker.ops:
            if hasattr(op, "take_updates") and op.name not in self.stores:
                self.stores[op.name] = open_store(
                    worker,
                    op.name,
                    f"the state of operator '{op.name}'",
                    retention=RETENTION,
                    # merges held to the same share of a core as mode nosync's (equal terms)
                    budget=self.options.persist_budget,
                    uploads=self.tier == "remote",
                    # a restore loads the whole state, reading no key alone
                    index_entries=False,
                )

    def on_start(self, worker: Worker, peers: dict) -> None:
        """Opens the keyed stores and, when the generation restores a checkpoint, puts every
        operator back to it: keyed state, metadata, the sinks' pre-commits."""
        self.worker = worker
        self.pending = {}
        self.aborted = set()
        self.align = {}
        self._open_stores(worker)
        restore = peers.get("restore")
        if restore is None:
            return  # a fresh run: nothing to restore
        c = int(restore["checkpoint"])
        # the coordinator read the checkpoint's file on the shared tier: its part for this
        # worker comes in the message, which a worker on any host has
        metas: dict = restore["workers"][worker.index]["ops"] if c >= 0 else {}
        for op in worker.ops:
            meta = metas.get(op.name)
            store = self.stores.get(op.name)
            if meta is not None and meta.get("keyed_state") is False:
                store = None  # its input had ended: the checkpoint holds no keyed state for it
            if store is not None:
                if store.last_seq < c:
                    raise RunFailed(
                        f"worker {worker.index}: the snapshot of checkpoint {c} of operator '{op.name}' is "
                        f"missing from its store {store.path} on {worker.address[0]} (it ends at seq "
                        f"{store.last_seq}): with --checkpoint-tier {self.tier} a store lives on its worker's host "
                        f"only; on a cluster, where a retry may run on another host, use --checkpoint-tier remote"
                    )
                store.rollback(c)
                if c >= 0:
                    restore_keyed(op, store)
            if meta is not None:
                op.restore_meta(meta)
            if isinstance(op, SinkOp):
                op.recover(c, list(meta["precommitted"]) if meta is not None else [])
            worker.keepalive()
        for op in worker.ops:
            if isinstance(op, LoopHead):
                # every operator holds the checkpoint's state: what the back edges carried goes round again
                op.replay_log()

    # -- checkpoints -----------------------------------------------------------------

    def _entry(self, n: int) -> dict:
        p = self.pending.get(n)
        if p is None:
            p = self.pending[n] = {
                "left": {op.name for op in self.worker.ops},
                "ops": {},
                "instances": [],
                "stores": [],
            }
        return p

    def _snapshot(self, op: Any, n: int, align_s: float = 0.0, held: int = 0, meta: dict | None = None) -> None:
        t = time.perf_counter()
        cpu = time.thread_time()
        if isinstance(op, SinkOp):
            op.precommit(n)
        if meta is None:
            meta = op.snapshot_meta()
        size = 0
        store = self.stores.get(op.name)
        if store is not None and op.frontier == EOS:
            # every input has ended before this barrier: no record will ever read this state
            # again, so the last checkpoint of a run does not persist it
            meta["keyed_state"] = False
            op.forget_updates()
            store = None
        if store is not None:
            updates = take_keyed(op)
            if n > store.last_seq:
                try:
                    size = store.append(n, {STATE: updates})
                except ValueEncodingError as e:
                    raise op.state_error(e) from None
                store.persist(self.tier)
        self.snapshot_cpu_s += time.thread_time() - cpu
        if n in self.aborted:
            return  # its barrier still aligns and moves on; nothing waits for its ack
        p = self._entry(n)
        p["ops"][op.name] = meta
        p["left"].discard(op.name)
        sync_s = time.perf_counter() - t
        row = {
            "operator": op.name,
            "align_ms": align_s * 1000,
            "held": held,
            "sync_ms": sync_s * 1000,
            "bytes": size,
            # a loop head's: its back-edge log, and the time from its snapshot to the barrier's return
            "backedge_bytes": meta.get("backedge_bytes", 0),
            "backedge_records": meta.get("backedge_records", 0),
            "backedge_ms": meta.pop("backedge_ms", 0.0),
        }
        if store is not None:
            p["stores"].append((store, row, time.perf_counter()))
        p["instances"].append(row)

    def on_control(self, worker: Worker, message: dict) -> None:
        """Acts on the coordinator's checkpoint messages: trigger (the sources snapshot and emit the
        barrier), complete (the sinks commit), abort."""
        op = message.get("op")
        n = int(message.get("n", -1))
        if op == AbsOp.TRIGGER:
            ev = {"barrier": n}
            for src in worker.sources:
                self._snapshot(src, n)
                src.forward_event(ev)
            if n not in self.aborted:
                # the sources' positions in the checkpoint (a restore reads on from them), not
                # what they have read by the time it is acknowledged
                self._entry(n)["read"] = sum(s.records_in for s in worker.sources)
        elif op == AbsOp.COMPLETE:
            self.completed = max(self.completed, n)
            for s in worker.sinks:
                s.commit_checkpoint(n)
        elif op == AbsOp.ABORT:
            self.pending.pop(n, None)
            self.aborted.add(n)

    def on_event(self, op: Any, channel: Any, event: dict) -> None:
        """Aligns a barrier: with one input, snapshots and forwards it at once; else blocks the
        channel until the barrier came on every input. Other events go on."""
        n = event.get("barrier")
        if n is None:
            op.forward_event(event)
            return
        if isinstance(op, LoopHead):
            self._loop_head_barrier(op, channel, n, event)
            return
        if len(op.inputs) <= 1:
            self._snapshot(op, n)
            op.forward_event(event)
            return
        waits = self.align.setdefault(op.name, {})
        a = waits.get(n)
        if a is None:
            a = waits[n] = {"chans": set(), "t0": time.perf_counter()}
        a["chans"].add(channel)
        op.block(channel)
        if len(a["chans"]) == len(op.inputs):
            del waits[n]
            self._snapshot(op, n, time.perf_counter() - a["t0"], op.held_records)
            op.forward_event(event)
            op.unblock()

    def _loop_head_barrier(self, head: LoopHead, channel: Any, n: int, event: dict) -> None:
        """A loop head on a cycle, as the ABS paper does it: the barrier on the loop's input
        takes the head's snapshot and goes into the body; from then on what comes back on each
        back channel is logged, until the barrier comes back round on it. The snapshot is the
        head's state and that log. A barrier back from a tail before the head's own (a body
        without exchanges runs ahead on another worker) blocks its channel until then: what
        follows it there is after the cut."""
        early = self.align.setdefault(head.name, {})
        if head.is_back(channel):
            if n not in head.cuts:
                early.setdefault(n, {"chans": set(), "t0": time.perf_counter()})["chans"].add(channel)
                head.block(channel)
                return
            meta = head.cut_barrier(channel, n)
            if meta is not None:
                self._snapshot(head, n, meta=meta)
            return
        head.start_cut(n)
        head.forward_event(event)
        ahead = early.pop(n, None)
        if ahead is not None:
            meta = None
            for chan in ahead["chans"]:
                meta = head.cut_barrier(chan, n) or meta
            if meta is not None:
                self._snapshot(head, n, meta=meta)
            head.release(ahead["chans"])

    def poll(self, worker: Worker) -> None:
        """Acknowledges, oldest first, the checkpoints every instance has snapshotted and whose
        stores are durable on the checkpoint tier. Commits a sink's fence deferred go again."""
        for s in worker.sinks:
            if s.deferred:
                s.commit_checkpoint(self.completed)
        if not self.pending:
            return
        for n in sorted(self.pending):
            p = self.pending[n]
            if p["left"]:
                return
            now = time.perf_counter()
            for store, row, t in p["stores"]:
                if store.durable(self.tier) < n:
                    err = store.error
                    if err is not None:
                        log.warning("checkpoint %s: %s", n, err)
                    return
                row.setdefault("async_ms", (now - t) * 1000)
            del self.pending[n]
            self.acked += 1
            worker.send_ctrl(
                control.mode_message(
                    AbsOp.ACK,
                    n=n,
                    gen=worker.gen,
                    ops=p["ops"],
                    instances=p["instances"],
                    read=p.get("read", sum(s.records_in for s in worker.sources)),
                )
            )

    def can_finish(self, worker: Worker) -> bool:
        """Whether no checkpoint awaits acknowledgement and no sink holds anything uncommitted."""
        return not self.pending and not any(s.uncommitted for s in worker.sinks)

    def metrics(self, worker: Worker) -> dict:
        """Checkpoints acknowledged, the stores' backpressure, the bytes appended to them, and
        where persistence's CPU went (as mode nosync reports it: the share both are compared by)."""
        stats = [s.stats for s in self.stores.values()]
        return {
            "checkpoints_acked": self.acked,
            "store_backpressure_s": sum(st.backpressure_s for st in stats),
            "bytes_persisted": sum(st.appended_bytes for st in stats),
            "persist_cpu_s": {
                "snapshots": self.snapshot_cpu_s,
                "store": sum(st.persist_cpu_s for st in stats),
                "merges": sum(st.merge_cpu_s for st in stats),
            },
        }

    def close(self, worker: Worker) -> None:
        """Closes the keyed stores (an error closing one is logged, not raised); a replaced
        attempt abandons them (its replacement restores from the checkpoint)."""
        for s in self.stores.values():
            try:
                s.abandon() if worker.replaced else s.close()
            except Exception:  # noqa: BLE001 - closing after a failure must not hide it
                log.exception("closing %s", s.path)
        self.stores = {}


# -- the driver half -------------------------------------------------------------------


class AbsMode(Mode):
    """The CheckpointCoordinator, and recovery by global rollback."""

    name = "abs"
    hooks_class = AbsHooks
    requires_replayable_sources = True

    def __init__(self, options: RunOptions | None = None, pipeline: str = "") -> None:
        super().__init__(options, pipeline)
        o = self.options
        self.interval_s = o.checkpoint_ms / 1000
        self.timeout_s = o.checkpoint_timeout_ms / 1000
        self.max_concurrent = o.max_concurrent_checkpoints
        self.shared = shared_of(o.run_dir, o.remote) if o.run_dir else None
        """The run's shared tier, where the checkpoint files go (`nosync.places`)."""
        self.resume = o.resume
        ids = checkpoints.completed(self.shared) if self.shared else []
        self.next_id = (ids[-1] + 1) if ids else 1
        self.pending: dict[int, dict] = {}
        self.last_trigger = 0.0
        self.completed_rows: list[dict] = []
        self.instance_rows: list[dict] = []
        self.aborted = 0
        self.read_at: dict[int, dict[int, int]] = {}
        """Per checkpoint: records each worker had read at its barrier."""
        self.recoveries: list[dict] = []
        self.fallbacks: list[str] = []
        self._idle_at: float | None = None

    # -- checkpoints -------------------------------------------------------------------

    def tick(self, coord: Any) -> None:
        """Aborts the checkpoints past their timeout and, within `max_concurrent`, triggers the next
        one when its interval is up or every worker is idle."""
        if not coord.all_ready:
            return
        now = time.monotonic()
        for n, p in list(self.pending.items()):
            if now - p["t0"] > self.timeout_s:
                self._abort(coord, n, f"not complete after {self.timeout_s:.0f}s")
        if len(self.pending) >= self.max_concurrent:
            return
        due = now - self.last_trigger >= self.interval_s
        idle = len(coord.counters) == coord.workers and all(
            c.get("idle") and c.get("gen") == coord.gen for c in coord.counters.values()
        )
        if idle and not self.pending and self.last_trigger < self._idle_since(coord, idle):
            due = True
        if due:
            self._trigger(coord, now)

    def _idle_since(self, coord: Any, idle: bool) -> float:
        if not idle:
            self._idle_at = None
            return float("inf")
        if self._idle_at is None:
            self._idle_at = time.monotonic()
        return self._idle_at

    def _trigger(self, coord: Any, now: float) -> None:
        n = self.next_id
        self.next_id += 1
        self.last_trigger = now
        self.pending[n] = {"t0": now, "acks": {}, "wall": time.time()}
        coord.broadcast(control.mode_message(AbsOp.TRIGGER, n=n, gen=coord.gen))

    def _abort(self, coord: Any, n: int, reason: str) -> None:
        self.pending.pop(n, None)
        self.aborted += 1
        coord.event("checkpoint_aborted", checkpoint=n, reason=reason)
        coord.broadcast(control.mode_message(AbsOp.ABORT, n=n, gen=coord.gen))

    def on_message(self, coord: Any, worker: int, msg: dict) -> None:
        """Counts a worker's acknowledgement of a checkpoint of this generation;
        the last one completes it."""
        if msg.get("op") != AbsOp.ACK or msg.get("gen") != coord.gen:
            return
        n = int(msg["n"])
        p = self.pending.get(n)
        if p is None:
            return
        p["acks"][worker] = msg
        if len(p["acks"]) == coord.workers:
            self._complete(coord, n, p)

    def _complete(self, coord: Any, n: int, p: dict) -> None:
        workers = {w: {"ops": a["ops"]} for w, a in p["acks"].items()}
        checkpoints.write(self.shared, n, checkpoints.body(self.pipeline, n, workers))
        del self.pending[n]
        for older in [c for c in self.pending if c < n]:
            self._abort(coord, older, f"subsumed by checkpoint {n}")
        duration = (time.monotonic() - p["t0"]) * 1000
        size = 0
        stall = 0.0
        backedge = 0
        for w, a in p["acks"].items():
            for row in a["instances"]:
                self.instance_rows.append({"checkpoint": n, "worker": w, **row})
                size += row.get("bytes", 0)
                stall = max(stall, row.get("align_ms", 0.0))
                backedge += row.get("backedge_bytes", 0)
        self.read_at[n] = {w: a.get("read", 0) for w, a in p["acks"].items()}
        self.completed_rows.append(
            {
                "checkpoint": n,
                "triggered_at": p["wall"],
                "duration_ms": duration,
                "bytes": size,
                "align_ms_max": stall,
                "backedge_bytes": backedge,
            }
        )
        coord.event("checkpoint_completed", checkpoint=n, duration_ms=round(duration, 2), bytes=size)
        coord.broadcast(control.mode_message(AbsOp.COMPLETE, n=n, gen=coord.gen))
        checkpoints.prune(self.shared, KEEP_FILES)

    # -- recovery ----------------------------------------------------------------------

    def on_worker_lost(self, coord: Any, worker: int, attempt: int, reason: str) -> None:
        """Records the loss, aborts every pending checkpoint and regroups: every worker restores the
        last completed checkpoint."""
        now = time.time()
        read_now = {w: c.get("read", 0) for w, c in coord.counters.items()}
        self.recoveries.append(
            {
                "worker": worker,
                "attempt": attempt,
                "reason": reason,
                "lost_at": now,
                "detection_s": coord.silent_s,
                "read_at_loss": read_now,
            }
        )
        for n in list(self.pending):
            self._abort(coord, n, f"worker {worker} lost")
        coord.regroup(f"worker {worker} (attempt {attempt}) was lost: {reason}")

    def on_generation(self, coord: Any, gen: int) -> dict:
        """The checkpoint the generation restores: the latest valid one (past damaged files) after a
        loss or on a resume; nothing on a fresh start."""
        if gen == 0 and not self.resume:
            return {}
        c, body, errors = checkpoints.latest_valid(self.shared)
        for e in errors:
            msg = f"{e}; falling back to an earlier checkpoint"
            log.warning(msg)
            self.fallbacks.append(str(e))
            coord.event("checkpoint_fallback", error=str(e))
        if body is not None and body.get("pipeline") != self.pipeline:
            raise RunFailed(
                f"{storage.redact(checkpoints.path_of(self.shared, c))} is a checkpoint of pipeline "
                f"'{body.get('pipeline')}', "
                f"not '{self.pipeline}'"
            )
        if self.recoveries and "checkpoint" not in self.recoveries[-1]:
            r = self.recoveries[-1]
            r["checkpoint"] = c
            # per worker, read at the loss less its sources' positions in the checkpoint: a
            # survivor's read is exact (sent when it rejoined), the lost worker's from its last
            # heartbeat (a lower bound, by up to one heartbeat interval)
            at_c = self.read_at.get(c, {})
            r["read_restored"] = {str(w): n for w, n in sorted(at_c.items())}
            now = {**r["read_at_loss"], **coord.read_at_rejoin}
            r["records_reprocessed"] = sum(max(0, now.get(w, 0) - at_c.get(w, 0)) for w in range(coord.workers))
        coord.event("restore", checkpoint=c)
        return {"restore": {"checkpoint": c, "workers": body["workers"] if body is not None else {}}}

    def on_ready(self, coord: Any, worker: int, gen: int) -> None:
        """Once every worker is ready: restarts the checkpoint interval and times the
        recoveries just finished."""
        if coord.all_ready:
            self.last_trigger = time.monotonic()
            for r in self.recoveries:
                if "restored_at" not in r:
                    r["restored_at"] = time.time()
                    r["restore_s"] = r["restored_at"] - r["lost_at"]

    def summary(self, coord: Any) -> dict:
        """Checkpoints completed and aborted, their durations and bytes, alignment stalls,
        recoveries and fallbacks."""
        durations = sorted(r["duration_ms"] for r in self.completed_rows)

        def pct(q: float) -> float | None:
            if not durations:
                return None
            return durations[min(len(durations) - 1, int(q * len(durations)))]

        per = workers_metrics(coord)
        cpu = persist_cpu(per, PERSIST_PARTS)
        return {
            "checkpoints_completed": len(self.completed_rows),
            "checkpoints_aborted": self.aborted,
            "checkpoint_ms_p50": pct(0.5),
            "checkpoint_ms_p99": pct(0.99),
            "checkpoint_bytes": sum(r["bytes"] for r in self.completed_rows),
            "backedge_log_bytes": sum(r["backedge_bytes"] for r in self.completed_rows),
            "backedge_log_bytes_max": max((r["backedge_bytes"] for r in self.completed_rows), default=0),
            "bytes_persisted": sum(m.get("bytes_persisted", 0) for m in per),
            "persist_cpu_s": cpu,
            "persist_share": persist_share(coord, sum(cpu.values())),
            "stall_ms_max": max((r.get("align_ms", 0.0) for r in self.instance_rows), default=0.0),
            "sync_ms_max": max((r.get("sync_ms", 0.0) for r in self.instance_rows), default=0.0),
            "held_records_max": max((r.get("held", 0) for r in self.instance_rows), default=0),
            "recoveries": [{k: v for k, v in r.items() if k not in ("read_at_loss",)} for r in self.recoveries],
            "checkpoint_fallbacks": self.fallbacks,
        }

    def tables(self) -> dict[str, list[dict]]:
        """Rows of checkpoints.parquet and checkpoint_instances.parquet."""
        return {"checkpoints": self.completed_rows, "checkpoint_instances": self.instance_rows}

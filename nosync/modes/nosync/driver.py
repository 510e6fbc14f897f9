"""The driver half of mode nosync: durable points, the safe point, recovery of one worker.

The coordinator collects each worker's durable point (its last durable lineage point: the step
a recovery replays to, the frontier there; and its last durable snapshot: the step a recovery
restores, the frames it had produced and consumed), and broadcasts them as they change with the
safe point, the least durable frontier (reported: sinks commit at their own worker's durable
point, `snapshots._commit_durable`); output logs and lineage are trimmed by the snapshots. A lost worker recovers alone
(`recovery.py`); a second loss while one recovers, or `run --resume`, restores every worker
(a new generation). With a replay threshold, a recovering worker's long span runs as a Spark
job on the run's own session (`span.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from lineage import safe_point
from nosync.modes.base import Mode, persist_cpu, persist_share, workers_metrics
from nosync.modes.nosync.hooks import NosyncHooks
from nosync.modes.nosync.messages import NosyncOp
from nosync.modes.nosync.span import run_span
from nosync.options import RunOptions
from nosync.runtime import control
from nosync.spark.batch import warm_up_soon

log = logging.getLogger("nosync.nosync")

BROADCAST_GAP_S = 0.005
"""The shortest time between two broadcasts of the durable points (they move every few
milliseconds; sinks commit on them)."""


class NosyncMode(Mode):
    """Collects durable points, broadcasts them with the safe point, and recovers a lost
    worker alone (every worker, when a second one is lost meanwhile)."""

    name = "nosync"
    hooks_class = NosyncHooks
    requires_replayable_sources = False  # the input log makes the others replayable

    def __init__(self, options: RunOptions | None = None, pipeline: str = "") -> None:
        super().__init__(options, pipeline)
        self.resume = self.options.resume
        self.points: dict[int, dict] = {}
        self.changed = False
        self.safe = -1
        self.safe_rows: list[dict] = []
        self.recovering: dict[int, dict] = {}
        self.replaying: set[int] = set()
        """Workers of a generation that restored every worker (a regroup, a resume) that have not
        said they replayed yet: a replaying worker cannot lose a peer and go on."""
        self.recoveries: list[dict] = []
        self.last_broadcast = 0.0
        self.threshold = self.options.replay_threshold_records
        self.spark: Any = None
        self.spec: dict = {}
        self.span_results: list[tuple[int, int, dict]] = []
        """(worker, generation, result) of span jobs done, for `tick` to hand over."""

    def attach(self, spark: Any, spec: dict) -> None:
        """Keeps the Spark session and the run's spec for span jobs, and warms Spark up for them
        when a replay threshold is set."""
        self.spark, self.spec = spark, spec
        if self.threshold:
            warm_up_soon(spark, spec["workers"], "span")

    def _span_job(self, worker: int, gen: int, msg: dict) -> None:
        try:
            got = run_span(self.spark, self.spec, {"worker": worker, "dir": msg["dir"], "tasks": msg["tasks"]})
            result = {"seconds": got["seconds"], "dir": msg["dir"]}
        except Exception as e:  # noqa: BLE001 - the worker re-executes the span itself
            log.warning("the span job of worker %s failed", worker, exc_info=True)
            result = {"error": f"{type(e).__name__}: {e}"[:2000], "dir": msg["dir"]}
        self.span_results.append((worker, gen, result))

    def on_message(self, coord: Any, worker: int, msg: dict) -> None:
        """Takes a worker's mode messages: a span job to run, a request to cover a recovering peer,
        a replay done (into its recovery's row), a newer durable point."""
        if msg.get("op") == NosyncOp.SPAN:
            coord.event("span_job", worker=worker, step=int(msg.get("step", 0)))
            threading.Thread(
                target=self._span_job, args=(worker, coord.gen, msg), name="nosync-span", daemon=True
            ).start()
            return
        if msg.get("op") == NosyncOp.COVER:
            coord.broadcast(control.mode_message(NosyncOp.SNAPSHOT_NOW, worker=worker, gen=coord.gen))
            # and the points as they stand: a restarted worker has seen none, and survivors
            # whose input ended take no snapshot that would broadcast them again
            self.changed = True
            return
        if msg.get("op") == NosyncOp.REPLAYED:
            lost = next((r for r in reversed(self.recoveries) if r["worker"] == worker), None)
            if lost is not None and int(msg["restored_step"]) < lost["durable_step"]:
                # its durable snapshot is gone: what its peers trimmed past it cannot be replayed
                coord.fail(
                    f"worker {worker} restored its snapshot at step {int(msg['restored_step'])}, but its durable "
                    f"point was a snapshot at step {lost['durable_step']}, in a store its retry on "
                    f"{coord.addresses.get(worker, ['?'])[0]} cannot reach: a store lives on its worker's host "
                    f"(--checkpoint-tier {self.options.checkpoint_tier}); on a cluster, where a retry may run on "
                    f"another host, use --checkpoint-tier remote or replicated"
                )
                return
            self.replaying.discard(worker)
            self.changed = True  # the others learn it is back (`away`) with the next points
            done = self.recovering.pop(worker, None)
            if done is not None:
                done["replayed_at"] = time.time()
                coord.event("replayed", worker=worker, steps=int(msg["steps"]))
            for r in reversed(self.recoveries):
                if r["worker"] == worker or r.get("global"):
                    # source records read again: from its position at the loss back to its
                    # restored snapshot's; its last heartbeat may lag what it had read, and
                    # what the replay read again counts exactly
                    r["read_restored"] = r.get("read_restored", 0) + int(msg["read_restored"])
                    r["records_replayed"] = r.get("records_replayed", 0) + int(msg["source_records"])
                    r["records_reprocessed"] = r.get("records_reprocessed", 0) + max(
                        r.get("read_at_loss", 0) - int(msg["read_restored"]), int(msg["source_records"])
                    )
                    r["frames_replayed"] = r.get("frames_replayed", 0) + int(msg["frames"])
                    r["frame_records_replayed"] = r.get("frame_records_replayed", 0) + int(msg["frame_records"])
                    r.setdefault("steps_replayed", 0)
                    r["steps_replayed"] += int(msg["steps"])
                    r["replay_restore_s"] = max(r.get("replay_restore_s", 0.0), float(msg["restore_s"]))
                    r["load_s"] = max(r.get("load_s", 0.0), float(msg.get("load_s", 0.0)))
                    r["keys_read_alone"] = r.get("keys_read_alone", 0) + int(msg.get("keys_read_alone", 0))
                    r["load_wait_s"] = max(r.get("load_wait_s", 0.0), float(msg.get("load_wait_s", 0.0)))
                    if self.threshold:
                        r["span_steps"] = int(msg.get("span_steps", 0))
                        r["span_records"] = int(msg.get("span_records", 0))
                        r["span_s"] = float(msg.get("span_s", 0.0))
                        r["span_reason"] = msg.get("span_reason")
                        r["span_parts"] = msg.get("span_parts") or {}
                    r["restored_step"] = int(msg["restored_step"])
                    r.setdefault("restored_from", {})[str(worker)] = msg.get("restored_from")
                    break
            return
        if msg.get("op") != NosyncOp.DURABLE:
            return
        p = msg["point"]
        old = self.points.get(worker)
        if old is None or (p["lstep"], p["step"]) >= (old["lstep"], old["step"]):
            self.points[worker] = p
            self.changed = True
            if p["step"] > (old["step"] if old else 0):
                # a durable snapshot: the step this worker's recovery now restores
                coord.event("snapshot", worker=worker, step=int(p["step"]))

    def due_in(self, coord: Any) -> float | None:
        """When the next tick has work: a finished span job at once, a changed durable point
        BROADCAST_GAP_S after the last broadcast (not when the next message happens to wake the
        coordinator's loop, up to its 50 ms later)."""
        return 0.0 if self.span_results else self._broadcast_in(time.monotonic())

    def _broadcast_in(self, now: float) -> float | None:
        """Seconds until the changed durable points may be broadcast (<= 0: now; None: none
        changed)."""
        return BROADCAST_GAP_S - (now - self.last_broadcast) if self.changed else None

    def tick(self, coord: Any) -> None:
        """Hands finished span jobs to their workers and, when a durable point changed, broadcasts
        the points with the safe point (at most every BROADCAST_GAP_S)."""
        while self.span_results:
            w, gen, result = self.span_results.pop(0)
            if gen == coord.gen:
                coord.send(w, control.mode_message(NosyncOp.SPAN_DONE, gen=gen, **result))
        now = time.monotonic()
        wait = self._broadcast_in(now)
        if wait is None or wait > 0:
            return
        self.changed = False
        self.last_broadcast = now
        s = safe_point(self.points, coord.workers)
        if s > self.safe:
            self.safe = s
            self.safe_rows.append({"t": time.time(), "safe_point": s})
            coord.event("safe_point", epoch=s)
        away = sorted({*self.recovering, *self.replaying})
        coord.broadcast(
            control.mode_message(NosyncOp.POINTS, points=self.points, safe=self.safe, away=away, gen=coord.gen)
        )

    def on_worker_lost(self, coord: Any, worker: int, attempt: int, reason: str) -> None:
        """Recovers the lost worker alone while the others go on; a second loss meanwhile makes
        every worker restore (a regroup); past --max-restarts, the run fails."""
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
        # a worker still replaying (alone, or after a regroup) fails its replay when a peer goes:
        # every worker restores then
        others = sorted(w for w in {*self.recovering, *self.replaying} if w != worker)
        coord.ready.discard(worker)
        coord.done.pop(worker, None)
        if others or not coord.all_ready and len(coord.ready) < coord.workers - 1:
            # a second worker lost while one recovers: every worker restores its own snapshot
            row["global"] = True
            self.recovering = {}
            self.replaying = set()
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
        coord.broadcast(control.mode_message(NosyncOp.LOST, worker=worker, attempt=attempt, gen=coord.gen))

    def on_rejoin(self, coord: Any, worker: int, attempt: int, address: list) -> None:
        """Sends the new attempt the peers to restore alone with, and tells every other
        worker to connect to it."""
        peers = [coord.members[i] for i in range(coord.workers)]
        extra = {"restore": True, "alone": True, "moved": dict(coord.moved), "source_t0": coord.source_clock.t0()}
        coord.send(worker, control.Peers(coord.gen, peers, extra))
        for w in range(coord.workers):
            if w != worker:
                coord.send(
                    w,
                    control.mode_message(
                        NosyncOp.PEER_BACK, worker=worker, attempt=attempt, address=address, gen=coord.gen
                    ),
                )

    def on_generation(self, coord: Any, gen: int) -> dict:
        """Every worker restores its own last snapshot (after a regroup or on a resume);
        nothing on a fresh start."""
        if gen == 0 and not self.resume:
            return {}
        self.replaying = set(range(coord.workers))
        coord.event("restore", scope="every worker")
        return {"restore": True}

    def on_ready(self, coord: Any, worker: int, gen: int) -> None:
        """Has the safe point sent again, and times the recovery of a worker that restored (of every
        worker, after a regroup)."""
        # a worker that restored learns the safe point at the next tick, even when it will not
        # change again (a loss after the last safe point of the run: nothing else would send it)
        self.changed = True
        row = self.recovering.get(worker)
        if row is not None and "restored_at" not in row:
            # restored and executing again (its replay is part of its recovery: it stays
            # recovering, for what a second loss means, until it says it replayed)
            row["restored_at"] = time.time()
            row["restore_s"] = row["restored_at"] - row["lost_at"]
            coord.event("recovered", worker=worker, restore_s=round(row["restore_s"], 3))
        if coord.all_ready:
            for r in self.recoveries:
                if r.get("global") and "restored_at" not in r:
                    r["restored_at"] = time.time()
                    r["restore_s"] = r["restored_at"] - r["lost_at"]

    def summary(self, coord: Any) -> dict:
        """Totals and maxima of the workers' persistence metrics, the safe
        point, and the recoveries."""
        per = workers_metrics(coord)

        def total(k: str) -> Any:
            return sum(m.get(k, 0) for m in per)

        return {
            "stall_ms_max": max((m.get("persist_stall_s", 0.0) * 1000 for m in per), default=0.0),
            "checkpoint_bytes": total("snapshot_bytes"),
            "bytes_persisted": total("bytes_persisted"),
            "residue_bytes": total("residue_bytes"),
            "output_log_peak_bytes": total("output_log_peak_bytes"),
            "snapshots": total("snapshots"),
            "lineage_points": total("lineage_points"),
            "lineage_points_logged_here": total("lineage_points_logged_here"),
            "open_precommits": total("open_precommits"),
            "snapshots_over_budget": total("over_budget"),
            "persist_share": persist_share(coord, total("persist_s")),
            "interval_ms_mean": 1000 * max((m.get("interval_s_mean", 0.0) for m in per), default=0.0),
            "interval_ms_max": 1000 * max((m.get("interval_s_max", 0.0) for m in per), default=0.0),
            "recovery_span_ms_max": 1000 * max((m.get("span_s_max", 0.0) for m in per), default=0.0),
            "recovery_span_records_max": max((m.get("span_records_max", 0) for m in per), default=0),
            "merges": total("merges"),
            "persist_cpu_s": persist_cpu(per, ("snapshots", "store", "merges", "replicas")),
            "replayed_steps": total("replayed_steps"),
            "frames_dropped_as_replayed": total("dropped_frames"),
            "lineage_frames": total("lineage_frames"),
            "output_log_spilled_frames": total("output_log_spilled_frames"),
            "residue_frames_resent": total("residue_frames_resent"),
            "input_logged_records": total("input_logged_records"),
            "durable_seqs": {
                w: d.get("metrics", {}).get("mode", {}).get("durable_seqs") for w, d in sorted(coord.done.items())
            },
            "level_lag_ms_max": {
                level: 1000 * max(m.get("level_lag_s", {}).get(level, 0.0) for m in per)
                for level in sorted({k for m in per for k in m.get("level_lag_s", {})})
            },
            "level_gap_ms_max": {
                level: 1000 * max(m.get("level_gap_s_max", {}).get(level, 0.0) for m in per)
                for level in sorted({k for m in per for k in m.get("level_gap_s_max", {})})
            },
            "replicas": self.options.replica_count,
            "replica_bytes_sent": total("replica_bytes_sent"),
            "replica_base_images": total("replica_base_images"),
            "replica_holder_losses": total("replica_holder_losses"),
            "replica_bytes_held_peak": max((m.get("replica_bytes_held_peak", 0) for m in per), default=0),
            "replica_holders_over_budget": {
                k: v for m in per for k, v in (m.get("replica_holders_over_budget") or {}).items()
            },
            "safe_point": self.safe,
            "safe_points": len(self.safe_rows),
            "recoveries": self.recoveries,
        }

    def tables(self) -> dict[str, list[dict]]:
        """The safe point over time (`safe_points`)."""
        return {"safe_points": self.safe_rows}

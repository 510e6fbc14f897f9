"""Mode `replay`: nothing persisted; a lost worker's state is recomputed by Spark batch jobs.

Steady state. No snapshot, no log: the only thing a worker keeps is the epoch its sinks have
committed, which it reports to the coordinator. Operators process epochs one after the other
(`Op.align_epochs`): an instance with several inputs holds back a channel that has finished
epoch e until every input has, so the state at the end of every epoch exists for a moment,
and everything an instance emits for epoch e is tagged e. Sinks commit an epoch as soon as
their inputs have finished it, as in mode none; a Files sink's commit of an epoch replaces
that worker's committed files of the epoch, if any (see recovery).

Recovery. A lost worker makes the coordinator pause the run: every worker drops its data
connections and waits (a new generation, held back). R is the last epoch every worker has
committed. Spark batch jobs (`nosync.spark.batch.recompute_states`) run the pipeline's own
operators over the sources up to the end of epoch R, stage by stage, parallel over keys, and
write every operator instance of every worker as it stood then: keyed state, frontiers,
watermarks, window bookkeeping, source positions. Every worker, the retried one and the
survivors alike, loads its instances from those files and drops what it staged; streaming
resumes at epoch R + 1. Epochs after R that a worker had committed already are recomputed
and committed again, replacing what was there, so nothing is written twice.

Why every worker and not only the lost one: without persistence a survivor cannot go back to
the end of an epoch, and its state has absorbed input the lost worker sent it after that
point, which the retry would send again. Recomputing every instance from the source is what
Spark's lineage offers; its cost grows with the input read so far, which is this mode's trade:
nothing to pay in steady state but alignment, everything to pay at a failure.

The batch jobs need task slots while the W streaming tasks hold theirs: the embedded master
has 2W, and a cluster with fewer is refused at start. Epochs must be cut by records
(`--epoch-records`): epochs cut by time cannot be recomputed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from nosync import storage
from nosync.errors import RunFailed
from nosync.modes.base import Mode
from nosync.options import RunOptions
from nosync.places import shared_of
from nosync.runtime import control
from nosync.runtime.heap import build_long_lived
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.keyed import KeyedOp
from nosync.runtime.operators import SinkOp
from nosync.spark.batch import load_states, recompute_states, warm_up_soon

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

log = logging.getLogger("nosync.replay")

HOLD_EVERY_S = 5.0
"""While state is recomputed, the workers are told this often to keep waiting."""
CHECK_STATE_EVERY_S = 1.0
CHECK_STATE_KEYS = 16
"""Now and then, each keyed instance saves the state of the keys it took on last and drops the
bytes: a recovery hands recomputed state to the workers as saved bytes, so a state that cannot
be saved (a datetime, an object) fails the run early, as at a first snapshot in the other
modes, and not only once a worker is lost."""


class ReplayOp(StrEnum):
    """What a replay mode message says."""

    COMMITTED = "committed"
    """worker -> coordinator: the epoch its sinks committed up to."""


class ReplayHooks(WorkerHooks):
    """The worker half of mode replay: epochs processed one after the other, the epoch committed
    reported, and instances loaded from Spark's recomputed state on a restore."""

    name = "replay"
    sink_commits_at_frontier = True
    aligns_epochs = True
    recovers = True

    def __init__(self, options: RunOptions | Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.reported = -1
        self.restored_epoch: int | None = None
        self.restore_s = 0.0
        self.next_state_check = 0.0

    def on_start(self, worker: Worker, peers: dict) -> None:
        """Makes sinks replace what they commit again and, when the generation restores epoch R,
        drops staged output and loads every instance as recomputed at the end of R."""
        for s in worker.sinks:
            s.part.replace = True
        restore = peers.get("restore")
        if restore is None:
            return
        t0 = time.perf_counter()
        epoch = int(restore["epoch"])
        self.restored_epoch = epoch
        self.reported = epoch
        for s in worker.sinks:
            s.part.abort()  # staged, never committed: it is recomputed
        if epoch < 0:
            return  # nothing committed anywhere yet: the run starts over
        with build_long_lived():
            saved = load_states(restore["dir"], worker.index)
            for op in worker.ops:
                got = saved.get(op.name)
                if got is None:
                    continue
                op.restore_meta(got["meta"])
                if isinstance(op, KeyedOp) and got["keyed"] is not None:
                    op.restore_keyed(got["keyed"], worker.keepalive)
                if isinstance(op, SinkOp):
                    op.committed_epoch = epoch
                worker.keepalive()
        self.restore_s = time.perf_counter() - t0

    def _check_state(self, worker: Worker) -> None:
        for op in worker.ops:
            if isinstance(op, KeyedOp):
                try:
                    op.check_saved(CHECK_STATE_KEYS)
                except RunFailed as e:
                    raise RunFailed(
                        f"{e} (mode replay loads recomputed state from saved bytes when a worker is lost)"
                    ) from None

    def can_finish(self, worker: Worker) -> bool:
        """Checks once more that the keyed state can be saved; then the worker may finish."""
        self._check_state(worker)  # a run too short for a check in `poll` gets one
        return True

    def poll(self, worker: Worker) -> None:
        """Now and then checks that the keyed state can be saved, and reports a newly committed
        epoch (the least over the sinks) to the coordinator."""
        now = time.monotonic()
        if now >= self.next_state_check:
            self.next_state_check = now + CHECK_STATE_EVERY_S
            self._check_state(worker)
        committed = min((s.committed_epoch for s in worker.sinks), default=None)
        if committed is None:
            return
        if committed > self.reported:
            self.reported = committed
            worker.send_ctrl(control.mode_message(ReplayOp.COMMITTED, gen=worker.gen, epoch=committed))

    def metrics(self, worker: Worker) -> dict:
        """The epoch this worker restored (None: none) and the seconds the restore took."""
        return {"restored_epoch": self.restored_epoch, "restore_s": self.restore_s}


class ReplayMode(Mode):
    """Tracks the epoch committed everywhere; on a loss, holds the next generation back while
    Spark recomputes every instance at the end of that epoch."""

    name = "replay"
    hooks_class = ReplayHooks
    requires_replayable_sources = True

    def __init__(self, options: RunOptions | None = None, pipeline: str = "") -> None:
        super().__init__(options, pipeline)
        self.run_dir = self.options.run_dir or "."
        self.resume = self.options.resume
        self.committed: dict[int, int] = {}
        self.recoveries: list[dict] = []
        self.spark: Any = None
        self.spec: dict = {}
        self._job: threading.Thread | None = None
        self._job_result: dict = {}
        self._last_hold = 0.0
        self.everywhere = -1

    def attach(self, spark: Any, spec: dict) -> None:
        """Keeps the Spark session and the run's spec for the batch jobs, and warms Spark up for
        them on the spare slots."""
        self.spark = spark
        self.spec = spec
        # the first batch job of a session starts Python workers and compiles what Arrow
        # needs; done now, on the spare slots, it is not paid at the first failure
        warm_up_soon(spark, spec["workers"], "replay")

    def on_message(self, coord: Any, worker: int, msg: dict) -> None:
        """Notes the epoch a worker committed, and the epoch committed everywhere when it moves."""
        if msg.get("op") != ReplayOp.COMMITTED:
            return
        self.committed[worker] = max(self.committed.get(worker, -1), int(msg["epoch"]))
        r = min(self.committed.get(w, -1) for w in range(coord.workers))
        if r > self.everywhere:
            self.everywhere = r
            coord.event("committed", epoch=r)

    def on_worker_lost(self, coord: Any, worker: int, attempt: int, reason: str) -> None:
        """Records the loss and regroups: every worker goes back to the epoch committed everywhere."""
        self.recoveries.append(
            {
                "worker": worker,
                "attempt": attempt,
                "reason": reason,
                "lost_at": time.time(),
                "detection_s": coord.silent_s,
                "read_at_loss": int(sum(c.get("read", 0) for c in coord.counters.values())),
            }
        )
        coord.regroup(f"worker {worker} (attempt {attempt}) was lost: {reason}")

    def on_generation(self, coord: Any, gen: int) -> dict | None:
        """Restores the epoch R committed everywhere, held back (None) while a Spark job recomputes
        every instance at its end (no job for R < 0); nothing on a fresh start."""
        if gen == 0 and not self.resume:
            return {}
        r = min(self.committed.get(w, -1) for w in range(coord.workers))
        # every worker starts again from the end of epoch r
        self.committed = {w: r for w in range(coord.workers)}
        row = self.recoveries[-1] if self.recoveries and "epoch" not in self.recoveries[-1] else None
        if row is not None:
            row["epoch"] = r
        if r < 0:
            coord.event("restore", epoch=r)
            return {"restore": {"epoch": r}}
        # on the shared tier: the batch jobs' tasks write it, every worker reads its part
        dump = storage.join(shared_of(self.run_dir, self.options.remote), "replay", f"g{gen}")
        coord.event("recomputing", epoch=r)
        self._job_result = {"epoch": r, "dir": dump, "gen": gen}
        self._job = threading.Thread(
            target=self._recompute, args=(r, dump, self._job_result), name="nosync-replay", daemon=True
        )
        self._job.start()
        coord.broadcast(control.Hold())
        self._last_hold = time.monotonic()
        return None

    def _recompute(self, epoch: int, dump: str, result: dict) -> None:
        t0 = time.time()
        try:
            got = recompute_states(
                self.spec["pipeline_file"],
                self.spec["params"],
                self.spec["workers"],
                self.spec.get("epoch_records"),
                epoch,
                dump,
                self.spark,
                batch_size=self.spec.get("batch_size", 1024),
                run_dir=self.run_dir,
                max_dead_letters=self.options.max_dead_letters,
            )
            result.update(batch_s=time.time() - t0, records_recomputed=got["read"])
        except Exception as e:  # noqa: BLE001 - reported by the coordinator's loop
            log.exception("recomputing the state of epoch %s", epoch)
            result["error"] = f"{type(e).__name__}: {e}"

    def tick(self, coord: Any) -> None:
        """While the batch job runs, tells the workers to keep waiting; once it is done, releases
        the generation with the recomputed state, or fails the run on its error."""
        job = self._job
        if job is None:
            return
        if job.is_alive():
            if time.monotonic() - self._last_hold >= HOLD_EVERY_S:
                coord.broadcast(control.Hold())
                self._last_hold = time.monotonic()
            return
        self._job = None
        res = self._job_result
        if res.get("gen") != coord.gen:
            return  # another loss started a newer generation meanwhile; it recomputes again
        if "error" in res:
            coord.fail(f"recomputing the state at the end of epoch {res['epoch']} failed: {res['error']}")
            return
        for r in self.recoveries:
            if r.get("epoch") == res["epoch"] and "batch_s" not in r:
                r["batch_s"] = res["batch_s"]
                r["records_recomputed"] = res["records_recomputed"]
                # the batch jobs read everything up to the end of the epoch again, the workers
                # everything after it: every record read before the loss is processed again
                r["records_reprocessed"] = max(r["read_at_loss"], res["records_recomputed"])
        coord.event("restore", epoch=res["epoch"], batch_s=round(res["batch_s"], 3))
        coord.release_generation({"restore": {"epoch": res["epoch"], "dir": res["dir"]}})

    def on_ready(self, coord: Any, worker: int, gen: int) -> None:
        """Once every worker is ready: times the recoveries just finished."""
        if coord.all_ready:
            for r in self.recoveries:
                if "restored_at" not in r:
                    r["restored_at"] = time.time()
                    r["restore_s"] = r["restored_at"] - r["lost_at"]

    def summary(self, coord: Any) -> dict:
        """The epoch committed everywhere, and the recoveries."""
        return {"committed_everywhere": self.everywhere, "recoveries": self.recoveries}

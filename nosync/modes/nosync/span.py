"""Mode nosync: a recovery's span re-executed as one Spark batch job, parallel over keys.

A worker that recovers restores its last durable snapshot S and re-executes the logged steps
after it (`recovery.py`), up to the last step L it or its survivors logged. With `--replay-threshold-records N`,
when that span holds more than N records, the steps up to a cut P inside it go to a Spark job
instead (`run_span`), and only the steps after P are re-executed one by one.

Cuts. Every few steps (and at every snapshot) a worker logs a cut: a flush of every exchange
buffer ("F"), then ("C", produced), its frame counters per link. After a cut nothing is
buffered, so the worker's whole state at P is its operators' state; and the counters say which
frames the steps up to P produced. A cut P can stand in for the steps up to it only when every
survivor has processed, and made durable, every frame produced up to P (`NosyncHooks` waits for
that, asking the survivors for a snapshot): nobody will ever ask for those frames again, so
they need not be produced again. The steps after P produce the same frames as before, bit for
bit, from the same state.

The job. Task t of T builds the recovering worker's operators (`build_ops`, the streaming
code), restores them from a copy of its store at S, and takes the same steps S+1..P: sources
read again from S's positions, the frames the survivors sent again (written by the worker to
the job's directory), the same flushes. Every task reads the whole span; a keyed operator
processes only the records whose key falls in part t of the worker's keys (an empty push for
the others, so that epochs advance as they did), so each key's records are folded in their
logged order by exactly one task. Frames for other workers are dropped; the share that stays
on the worker goes on as it did. Each task writes, msgpack, the keyed state its keys had at P,
what reached its sinks (tagged with the step and the keyed push it came from, so that the
worker stages it in the original order), and its operators' frontiers; the worker loads them
and goes on from P.

Which pipelines (`eligible`). Keys must stay in one task from the keyed operator to the sink:
no keyed operator downstream of another, no join, window or loop, every keyed operator fed
through an exchange, and no operator that mixes what a keyed operator emitted with what did
not pass one (that would interleave two tasks' output). Sources must restart from a position
(the job reads them again; a source behind an input log does not). For any other pipeline, or
when no cut in the span qualifies, recovery re-executes record by record, and says why.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from typing import Any

from lineage import Step
from nosync import codec, storage
from nosync.api.loader import spec_pipeline
from nosync.api.pipeline import KEYED_KINDS
from nosync.api.plan import plan
from nosync.api.sinks import SinkPart
from nosync.errors import RunFailed
from nosync.modes.nosync.messages import NosyncOp
from nosync.modes.nosync.steps import next_frame, precommit_again
from nosync.runtime import control, frames
from nosync.runtime.graph import key_hash
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.keyed import KeyedOp
from nosync.runtime.operators import Op, SinkOp
from nosync.runtime.router import Router
from nosync.runtime.worker import Worker
from nosync.spark.tasks import ERROR, SCHEMA, STATS, fail_fast, rows_batch
from nosync.state.layout import META, store_state
from nosync.state.stores import get_store, put_store, read_store

log = logging.getLogger("nosync.nosync")


def _below_keyed(p: Any) -> dict[int, bool]:
    """node id -> whether it is a keyed operator or downstream of one."""
    nodes = p.pipeline.nodes
    below: dict[int, bool] = {}
    for n in nodes:  # node order is topological: inputs come first
        below[n.id] = n.kind in KEYED_KINDS or any(below[e.src] for e in p.inputs_of(n.id))
    return below


def eligible(p: Any) -> str | None:
    """None if a recovery of pipeline plan `p` can hand its span to the batch job; else why not."""
    for n in p.pipeline.nodes:
        if n.kind == "iterate" or n.kind.startswith("loop") or n.params.get("loop_internal"):
            return f"operator '{n.name}' is part of a loop"
        if n.kind in ("join", "window"):
            return f"operator '{n.name}' is a {n.kind}"
        if n.kind == "source" and not n.params["source"].replayable:
            return f"source '{n.name}' cannot restart from a position (it goes through an input log)"
    below = _below_keyed(p)
    for n in p.pipeline.nodes:
        ins = p.inputs_of(n.id)
        if n.kind in KEYED_KINDS:
            if any(below[e.src] for e in ins):
                return f"keyed operator '{n.name}' is downstream of another keyed operator"
            if not ins or not all(e.exchange for e in ins):
                return f"keyed operator '{n.name}' is not fed through an exchange"
        elif len({below[e.src] for e in ins}) > 1:
            return f"operator '{n.name}' mixes records of keyed operators with records that passed none"
    return None


def part_of(key: Any, workers: int, tasks: int) -> int:
    """The task that folds `key` among a worker's `tasks` (the worker's keys all share
    hash % workers: the quotient spreads them)."""
    return (key_hash(key) // workers) % tasks


# -- inside a task ---------------------------------------------------------------------


class _Hooks(WorkerHooks):
    name = "span"
    sink_commits_at_frontier = False
    tracks_dirty = True


class _LocalRouter(Router):
    """Passes on the share of its worker as a streaming router does, and drops the buffers of
    the others instead of sending them (those frames were consumed already)."""

    def send_buffer(self, d: int) -> None:
        self.buffers[d] = []

    def _broadcast(self, kind: int, header: dict, body: Any = None) -> None:
        pass


class _Capture(SinkPart):
    """What reaches a sink in a task: (step, keyed push, epoch, records), in order."""

    def __init__(self, task: Any, keep: bool) -> None:
        super().__init__()
        self.task = task
        self.keep = keep
        self.rows: list = []

    def write(self, epoch: int, records: list) -> None:
        if self.keep and records:
            self.rows.append((self.task.step, self.task.ordinal, epoch, codec.pack_state(list(records))))

    def seal(self, epoch: int) -> None:
        pass


class _SpanWorker(Worker):
    """A worker with no peers and no coordinator: the operators and routers of worker
    `index`, driven by the steps of a span."""

    router_class = _LocalRouter

    def __init__(self, index: int, spec: dict, task: int, tasks: int, pure_sinks: set) -> None:
        super().__init__(index, 0, {**spec, "secret": b"", "mode": "none"}, _Hooks())
        self.slow_s = 0.0
        self.task, self.tasks = task, tasks
        self.pure_sinks = pure_sinks
        self.step = 0
        self.ordinal = 0
        self.captures: dict[str, _Capture] = {}

    def _sink_op(self, n: Any) -> SinkOp:
        # what did not pass a keyed operator is the same in every task: task 0 keeps it
        cap = self.captures[n.name] = _Capture(self, self.task == 0 or n.id not in self.pure_sinks)
        return SinkOp(n, cap, self.clock)

    def dead_letter(self, op_name: str, bad: Any) -> None:
        pass  # the lost worker wrote them when it read them first

    def keepalive(self) -> None:
        pass


def _gate(w: _SpanWorker, op: KeyedOp) -> None:
    """Op `op` folds only the keys of task `w.task`: the others' records are dropped before
    it, but the push itself still happens (its epochs advance as in the streaming run)."""
    push = op.push
    W, T, t = w.workers, w.tasks, w.task

    def gated(records: list, epoch: int, channel: Any) -> None:
        w.ordinal += 1
        push([r for r in records if part_of(r[0], W, T) == t], epoch, channel)

    op.push = gated  # type: ignore[method-assign]


def _pure_sinks(p: Any) -> set:
    below = _below_keyed(p)
    return {n.id for n in p.pipeline.nodes if n.kind == "sink" and not below[n.id]}


def run_task(spec: dict, job: dict, task: int, tasks: int) -> dict:
    """Task `task` of a span job: writes its part of the worker's state at the cut to
    `<dir>/t<task>.msgpack`; returns what it did."""
    t0 = time.time()
    me = int(job["worker"])
    p = plan(spec_pipeline(spec), spec["workers"])
    w = _SpanWorker(me, spec, task, tasks, _pure_sinks(p))
    w.build(p)
    for op in w.ops:
        if isinstance(op, KeyedOp):
            _gate(w, op)
    span = codec.read_file(storage.join(job["dir"], "span.msgpack"))
    # a copy of the recovering worker's store on the host this task runs on: beside the job's
    # own where that is local (its tables then linked, not copied)
    near = storage.local_path(job["dir"]) if storage.is_local(job["dir"]) else None
    scratch = tempfile.mkdtemp(prefix="nosync-span-", dir=near)
    store = None
    try:
        copy = os.path.join(scratch, "store")
        get_store(storage.join(job["dir"], "base"), copy)
        store = read_store(copy)
        restore = int(span["restore_seq"])
        raw = store.get(META, 0, as_of=restore) if restore >= 0 else None
        metas = codec.unpack(raw)["ops"] if raw is not None else {}
        for i, op in enumerate(w.ops):
            m = metas.get(op.name)
            if m is not None:
                op.restore_meta(m)
            if isinstance(op, KeyedOp) and raw is not None:
                store_state(store, i, op, restore)
        read0 = sum(src.records_in for src in w.sources)
        inputs = iter(span["frames"])
        for step, entry in span["entries"]:
            w.step = int(step)
            kind = entry[0]
            if kind == Step.CONSUMED:
                j, fkind, header, body = next(inputs)
                w.process_frame(int(j), frames.Frame(int(fkind), header, body))
            elif kind == Step.READ:
                w.sources[int(entry[1])].poll(entry[2])
            elif kind == Step.STOPPED:
                for src in w.sources:
                    src.stop(entry[1])
            # "f", "F", "C": flushes of buffers that hold nothing here (remote shares dropped)
        keyed = {}
        for i, op in enumerate(w.ops):
            if isinstance(op, KeyedOp):
                u = op.take_updates()
                changed = set(u.keys)
                for _, chunk in u.pairs:
                    logged = codec.unpack(chunk)  # a map (an array of pairs from older writers)
                    changed.update(logged if isinstance(logged, dict) else (k for k, _ in logged))
                keyed[i] = [
                    (k, codec.pack_state(op.state[k]), False) if k in op.state else (k, None, True) for k in changed
                ]
        out = {
            "task": task,
            "keyed": keyed,
            "meta": {op.name: op.snapshot_meta() for op in w.ops},
            "sinks": {name: cap.rows for name, cap in w.captures.items()},
            "read": sum(src.records_in for src in w.sources) - read0,
            "folded": sum(op.records_in for op in w.ops if isinstance(op, KeyedOp)),
            "seconds": time.time() - t0,
        }
        codec.write_file(storage.join(job["dir"], f"t{task}.msgpack"), out)
        return {k: out[k] for k in ("task", "read", "folded", "seconds")}
    finally:
        if store is not None:
            store.close()
        shutil.rmtree(scratch, ignore_errors=True)


# -- the driver ------------------------------------------------------------------------


def run_span(spark: Any, spec: dict, job: dict) -> dict:
    """Runs the span job `job` ({"worker", "dir", "tasks"}) as one Spark job of `tasks`
    tasks; returns per task what it read and folded. Raises RunFailed with a task's error."""
    tasks = int(job["tasks"])
    spec = {k: v for k, v in spec.items() if k != "secret"}

    @fail_fast
    def run(batches: Any) -> Any:
        for batch in batches:
            for t in batch.column(0).to_pylist():
                got = run_task(spec, job, int(t), tasks)
                yield rows_batch([(int(t), -1, int(t), 0, STATS, 0, codec.pack(got))])

    t0 = time.time()
    rows = spark.range(0, tasks, 1, tasks).mapInArrow(run, SCHEMA).select("kind", "data").collect()
    out = []
    for kind, data in rows:
        if kind == ERROR:
            raise RunFailed(f"the span job of worker {job['worker']}: {codec.unpack(data)['text']}")
        out.append(codec.unpack(data))
    return {"tasks": out, "seconds": time.time() - t0}


# -- back in the recovering worker ---------------------------------------------------------


def load_results(job_dir: str, tasks: int, ordered: set) -> dict:
    """The tasks' files, merged: keyed state per operator index, each operator's meta (its
    epochs the greatest any task reached), and per sink the records to stage, in the order
    the streaming run staged them (by step, then by the keyed push they came from). For the
    sinks named in `ordered` (their parts' output depends on that order: LevelDB, where the
    last write of a key wins), RunFailed if two tasks wrote one key in the same push, whose
    order is then unknown."""
    got = []
    for t in range(tasks):
        got.append(codec.read_file(storage.join(job_dir, f"t{t}.msgpack")))
    meta = dict(got[0]["meta"])
    for g in got[1:]:
        for name, m in g["meta"].items():
            if m.get("last_epoch", -1) > meta[name].get("last_epoch", -1):
                meta[name] = {**meta[name], "last_epoch": m["last_epoch"]}
    keyed: dict[int, list] = {}
    for g in got:
        for i, items in g["keyed"].items():
            keyed.setdefault(int(i), []).extend(items)
    sinks: dict[str, list] = {}
    for name in got[0]["sinks"]:
        rows = sorted(
            (step, ordinal, t, n, epoch, data)
            for t, g in enumerate(got)
            for n, (step, ordinal, epoch, data) in enumerate(g["sinks"][name])
        )
        staged = [(step, ordinal, t, epoch, codec.unpack_state(data)) for step, ordinal, t, _, epoch, data in rows]
        if name in ordered:
            _check_order(name, staged)
        sinks[name] = [(epoch, recs) for _, _, _, epoch, recs in staged]
    return {
        "keyed": keyed,
        "meta": meta,
        "sinks": sinks,
        "read": got[0]["read"],  # every task reads the whole span
        "folded": sum(g["folded"] for g in got),
    }


def _check_order(name: str, rows: list) -> None:
    """Two tasks that wrote one key in the same keyed push: which came last is unknown."""
    seen: dict[tuple, int] = {}
    for step, ordinal, t, _, recs in rows:
        for rec in recs:
            try:
                k = codec.pack(rec[0])
            except (TypeError, IndexError, ValueError):
                continue
            first = seen.setdefault((step, ordinal, k), t)
            if first != t:
                raise RunFailed(
                    f"sink '{name}': key {rec[0]!r:.40} was written by two tasks in one step; their order is unknown"
                )


# -- the recovering worker's side ------------------------------------------------------------

COVER_TIMEOUT_S = 30.0
"""How long a worker whose span job is done waits for its survivors' durable points to cover
the job's cut (they were asked for a snapshot) before it re-executes the span itself."""


def hand_over(self: Any, worker: Worker, entries: list, pump: Any) -> int:
    """With a replay threshold: when the span to re-execute holds more records than it,
    hands the steps up to its last usable cut to a Spark batch job (`nosync_span`) and
    loads what the job computed. Returns how many of `entries` that covered (0: none; the
    reason is kept in `span_reason`)."""
    me, W = worker.index, worker.workers
    if self.cut_steps == 0:
        return 0  # the pipeline is not eligible: `span_reason` says why
    # the records the span reads again and takes from peers, a full chunk per step at most
    size = sum(1 for _, e in entries if e[0] in (Step.READ, Step.CONSUMED)) * worker.batch_size
    if size <= int(self.threshold):
        self.span_reason = f"the span ({size:,} records at most) is within the threshold"
        return 0
    cut = None
    for x, (_, e) in enumerate(entries):
        if e[0] == Step.CUT and all(int(e[1][j]) <= self.peer_consumed.get(j, 0) for j in range(W) if j != me):
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
        if e[0] == Step.CONSUMED:
            j = int(e[1])
            f = next_frame(self, j, int(e[2]), pump)
            worker.credit(j)  # held here, not in the link's window
            got.setdefault(j, []).append(f)
            inputs.append((j, f.kind, f.header, f.body))

    def give_back() -> None:
        for j, fs in got.items():
            self.queue[j].extendleft(reversed(fs))

    # on the shared tier: the job's tasks run on other executors, maybe on other hosts
    spans = worker.places.shared_path("span")
    for old in storage.listdir(spans):
        if old.startswith(f"w{me}-"):
            storage.delete_tree(storage.join(spans, old))  # a lost attempt's
    job_dir = storage.join(spans, f"w{me}-a{worker.attempt}-s{self.step}")
    storage.makedirs(job_dir)
    codec.write_file(
        storage.join(job_dir, "span.msgpack"),
        {"restore_step": self.step, "restore_seq": self.snap_seq, "entries": taken, "frames": inputs},
    )
    t1 = time.perf_counter()
    # the job reads the store at the snapshot from a copy, made while nobody writes it
    if self.loader is not None:
        self.loader.wait()
        self.loader.install_done(worker)
    path = self.store.path
    self.store.close()
    try:
        put_store(path, storage.join(job_dir, "base"))
    finally:
        self.store = None
        self._open_store(worker)
    t2 = time.perf_counter()
    covered = _covered(self, counters)
    if not covered:
        worker.send_ctrl(control.mode_message(NosyncOp.COVER, gen=worker.gen))
    self.span_done = None
    worker.send_ctrl(
        control.mode_message(NosyncOp.SPAN, gen=worker.gen, dir=job_dir, tasks=W, step=self.step),
    )
    while self.span_done is None or self.span_done.get("dir") != job_dir:
        pump(0.05)
        covered = covered or _covered(self, counters)
    done, self.span_done = self.span_done, None
    why = done.get("error")
    t3 = waited = time.perf_counter()
    while why is None and not covered:
        if time.perf_counter() - waited > COVER_TIMEOUT_S:
            why = f"the survivors' durable points did not cover the cut within {COVER_TIMEOUT_S:.0f}s"
            break
        pump(0.05)
        covered = _covered(self, counters)
    result = None
    if why is None:
        try:
            ordered = {op.name for op in worker.sinks if op.part.order_matters}
            result = load_results(job_dir, W, ordered)
        except Exception as e:  # noqa: BLE001 - the worker re-executes the span itself
            why = f"{type(e).__name__}: {e}"
    if result is None:
        log.warning("worker %s: the span job is not used (%s): re-executing record by record", me, why)
        self.span_reason = f"the span job was not used: {why}"
        give_back()
        storage.delete_tree(job_dir)
        return 0
    t4 = time.perf_counter()
    _apply_span(self, worker, taken, counters, got, result)
    storage.delete_tree(job_dir)
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


def _covered(self: Any, counters: list) -> bool:
    """Whether every survivor's durable point covers the frames produced up to the cut."""
    me = self.w.index
    for j, c in enumerate(counters):
        if j != me and c > int((self.peer_points.get(j) or {}).get("consumed", {}).get(me, 0)):
            return False
    return True


def _apply_span(self: Any, worker: Worker, taken: list, counters: list, got: dict, result: dict) -> None:
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
                op.state[k] = codec.unpack_state(v)
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
    cut = int(taken[-1][0])
    for step in sorted(s for s in self.pc_at if s <= cut):
        # the pre-commits the steps up to the cut made, again under their ids: each covered
        # epochs sealed when it was made, whose records are all staged now
        precommit_again(self, worker, self.pc_at.pop(step))
    for _, entry in taken:
        if entry[0] == Step.CONSUMED:
            self.consumed[int(entry[1])] = int(entry[2])
    for j, fs in got.items():
        fp = self.fps.setdefault(j, {})
        for f in fs:
            fp[f.header["s"]] = f.header.get("fp")
    self.stash.add(me, [(int(step), tuple(entry)) for step, entry in taken])
    self.step = int(taken[-1][0])
    self.produced = {d: c for d, c in enumerate(counters) if d != me and c}
    for d in list(self.outlog.frames):
        # produced before the cut: every receiver's durable point covers them
        self.outlog.trim(d, self.produced.get(d, 0))
    self.replayed_steps += len(taken)
    self.span_steps += len(taken)
    self.span_records += int(result["read"]) + sum(
        len(f.body) for fs in got.values() for f in fs if f.kind == frames.DATA
    )

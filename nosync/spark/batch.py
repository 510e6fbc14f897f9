"""A pipeline over bounded input as Spark batch jobs, stage by stage.

A stage is what lies between exchanges: the stage of an operator is the greatest number of
exchange edges on a path from a source to it (loops never hold an exchange, so a loop lies
inside one stage). Stage 0 is W Spark tasks, task w reading the source partitions that
streaming worker w would read; every later stage is one Spark job over what earlier stages
sent it, shuffled by destination (the same xxhash partitioning of keys as the streaming
routers) and sorted, per destination, by (epoch, sending task, edge, order of emission).

Inside a task, the operators of the stage are the streaming worker's own instances
(`build_ops`), fed the same batches and progress markers: a map, a keyed aggregate, a window
or a join runs the same code in both, with no second implementation. Output that leaves the
stage (an exchange, or a forward edge into a later stage) is captured as rows
`(dest, edge, src, seq, kind, epoch, data)`, records and markers msgpack-encoded, and crosses
Spark as Arrow (`mapInArrow`): nothing is pickled. Each stage's rows are materialized once
(`localCheckpoint`), so no task of a stage runs twice for a later one; a sink commits each
epoch under the file names a streaming run would use, so a task Spark retries writes the
same files again.

Epochs are cut by records per source partition (`epoch_records`); `epoch_ms` has no meaning
over bounded input.

The same jobs answer "what was the keyed state of operator X at the end of epoch E"
(`keyed_state`): the sources stop once epoch E is closed (no end of input follows, so windows
stay open as they stood), sinks write nothing, the stages run up to X's, and X's instances
hand back their state. Mode replay recovers with them (`recompute_states`): every operator
instance of every worker, as it stood at the end of the last epoch committed everywhere,
written to files the restarted workers load.

A rewind of an abs run starts the jobs from one of its checkpoints (`restore` in the spec):
every task's operators load what the checkpoint holds for their worker, so the sources start
at its positions and the stages carry on from its consistent cut. A rewind of a nosync run
starts them from a consistent cut of its workers' snapshots the same way, and stage 0 also
emits the frames that were in flight at the cut, which sort ahead of everything else on
their link.

A source that cannot restart from a position (TcpLines) refuses batch jobs, except over a
nosync run's input log (`input_logs` in the spec, a copy of the run's logs): task w then
reads the chunks worker w logged, and ends where its log ends.

A task that raises does not let Spark retry it (the embedded master retries tasks as often
as streaming workers may be retried): it ends with an ERROR row, which the driver raises.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import msgpack

from nosync.api import sinks
from nosync.api.pipeline import KEYED_KINDS, require_replayable
from nosync.api.plan import PhysicalPlan, plan
from nosync.errors import NosyncError, PipelineError, RunFailed
from nosync.modes import WorkerHooks, read_store
from nosync.runtime import checkpoints, frames, statecodec
from nosync.runtime.operators import EOS, KeyedOp, SinkOp
from nosync.runtime.worker import SourceOp, Worker, add_edge_input, build_ops, finish_loops, graph_edges, partition_of

SCHEMA = "dest int, edge int, src int, seq long, kind tinyint, epoch long, data binary"
DATA, MARK, STATS, STATE, ERROR, HERE = 0, 1, 2, 3, 4, 5
"""Row kinds: records, a progress marker, one row per task of what it read and committed,
(key, state) pairs of the operator asked for, the error a task stopped on (edge -1: no stage
reads these three), and a row that only makes a later stage run a destination's task (a
restored run can leave a destination nothing else: its inputs ended before the cut)."""
DEFAULT_EPOCH_RECORDS = 10_000


def epoch_records_of(run: dict) -> int:
    """The records per source partition that cut the epochs of a run (its run.json)."""
    return int(run.get("epoch_records") or DEFAULT_EPOCH_RECORDS)


def stages(p: PhysicalPlan) -> dict[int, int]:
    """node id -> its stage."""
    edges = graph_edges(p)
    stage = {n.id: 0 for n in p.pipeline.nodes}
    changed = True
    while changed:
        changed = False
        for e in edges:
            s = stage[e.src] + (1 if e.exchange else 0)
            if s > stage[e.dst]:
                stage[e.dst] = s
                changed = True
    return stage


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    # arrays come back as tuples, as from a frame (`frames.decode`): an operator gets the same
    # records in a batch job as in a streaming worker, and a tuple key stays hashable
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


def _pack_forward(records: list, sender: str) -> bytes:
    try:
        return statecodec.pack(records)
    except TypeError as e:
        raise RunFailed(
            f"{sender} emitted a record that cannot be handed to the next stage of a batch job ({e}); "
            f"records that leave a stage must be {frames.RECORD_TYPES}, or sets, Counters and OrderedDicts"
        ) from None


class _Clock:
    ts = 0.0


class _Host:
    """What the operators of one task ask of their worker."""

    def __init__(self, index: int, workers: int, spec: dict) -> None:
        self.index = index
        self.workers = workers
        self.spec = spec
        self.batch_size = spec["batch_size"]
        self.epoch_records = spec["epoch_records"]
        self.epoch_ms = None
        self.slow_s = 0.0
        self.clock = _Clock()
        self.first_read_at: float | None = None
        self.dead_letters = 0
        self._dl_file: Any = None
        self._dl_seen: set = set()
        self.rows: list[tuple] = []
        self.seq = 0
        self.writers: list = []
        self._inputs: Any = None

    dead_letter = Worker.dead_letter

    def input_log(self) -> Any:
        """This worker's input log in the copy of the run's logs, opened on first use."""
        if self._inputs is None:
            path = os.path.join(self.spec["input_logs"], f"w{self.index}", "input")
            if not os.path.isdir(path):
                raise NosyncError(f"worker {self.index} of the run left no input log: {path} does not exist")
            self._inputs = read_store(path)
        return self._inputs

    def close(self) -> None:
        if self._inputs is not None:
            self._inputs.close()
            self._inputs = None

    def keepalive(self) -> None:
        pass


class _LoggedSource:
    """A source that cannot restart from a position, read back from the input log a nosync
    run kept of it (`modes.nosync.InputLog`): the chunks worker w logged, then its end."""

    replayable = True

    def __init__(self, inner: Any, index: int, host: _Host) -> None:
        self.inner, self.index, self.host = inner, index, host

    def partitions(self, workers: int | None = None) -> list[dict]:
        return self.inner.partitions(workers)

    def describe(self) -> str:
        return f"{self.inner.describe()} from the run's input log"

    def read(self, part: dict, offset: Any, chunk: int, on_bad: Any) -> Any:
        from nosync.modes.nosync import InputLog

        log = InputLog(self.inner, self.index, self.host.input_log(), None, live=False)
        return log.read(part, offset, chunk, on_bad)


class _Capture:
    """The sending end of an edge that leaves the stage: rows for the stages after it."""

    def __init__(self, host: _Host, edge: Any, src: Any) -> None:
        self.host = host
        self.edge = edge
        self.cache: dict = {}
        self.sender = f"operator '{src.name}' (declared at {src.node.where})"

    def _row(self, dest: int, kind: int, epoch: int, data: bytes) -> None:
        h = self.host
        h.seq += 1
        h.rows.append((dest, self.edge.id, h.index, h.seq, kind, epoch, data))

    def push(self, records: list, epoch: int, _chan: Any) -> None:
        h = self.host
        if not self.edge.exchange:
            # a forward edge hands records over as they are in a streaming worker: lists stay lists
            self._row(h.index, DATA, epoch, _pack_forward(records, self.sender))
            return
        n = h.workers
        cache = self.cache
        buckets: list[list] = [[] for _ in range(n)]
        for rec in records:
            k = rec[0]
            try:
                d = cache.get(k)
            except TypeError:  # a key holding a list: it goes where its tuple form goes
                d = partition_of(k, n)
            if d is None:
                d = cache[k] = partition_of(k, n)
            buckets[d].append(rec)
        for d, b in enumerate(buckets):
            if b:
                self._row(d, DATA, epoch, frames.pack_records(b, self.sender))

    def marker(self, _chan: Any, epoch: int, wm: Any, eos: bool) -> None:
        h = self.host
        dests = range(h.workers) if self.edge.exchange else (h.index,)
        data = _pack([wm, eos])
        for d in dests:
            self._row(d, MARK, epoch, data)

    def event(self, _chan: Any, ev: dict) -> None:
        pass  # no barriers in a batch job


class _Switch:
    """An operator of a rewound cone: the original pipeline's instance up to the end of epoch
    E - 1, then the new pipeline's, which takes over its state, frontiers and watermarks."""

    def __init__(self, old: Any, new: Any, epoch: int) -> None:
        self.old, self.new, self.epoch = old, new, epoch
        self.cur = old

    def _at(self, epoch: int) -> Any:
        if self.cur is self.old and epoch >= self.epoch:
            self.new.restore_meta(self.old.snapshot_meta())
            if isinstance(self.old, KeyedOp):
                self.new.state = self.old.state
            self.cur = self.new
        return self.cur

    def push(self, records: list, epoch: int, channel: Any) -> None:
        self._at(epoch).push(records, epoch, channel)

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
        self._at(EOS if eos else epoch).marker(channel, epoch, wm, eos)

    def event(self, channel: Any, ev: dict) -> None:
        self.cur.event(channel, ev)

    def connect(self, *args: Any) -> None:
        self.old.connect(*args)
        self.new.connect(*args)


def _task_graph(p: PhysicalPlan, stage: dict[int, int], s: int, host: _Host) -> tuple[list, dict]:
    """The operators of stage `s` on `host`, wired: forward edges inside the stage call
    through, edges leaving it go to captures, edges entering it get their channels. For a
    rewind, `p` is the new pipeline: in the cone its instances take over from the original's
    at the rewind's epoch, and its sinks write everything; elsewhere the original pipeline
    runs, and its sinks write nothing."""
    keep = {i for i, st in stage.items() if st == s}
    run_id = host.spec["run_id"]
    rewind = host.spec.get("rewind")
    dry = host.spec.get("state_of") is not None or host.spec.get("dump_dir") is not None
    cone = set(rewind["cone"]) if rewind else set()

    def sink_op(n: Any, writes: bool) -> SinkOp:
        sink = n.params["sink"] if writes and not dry else sinks.Null()
        return SinkOp(n, sink.open_part(host.index, run_id), host.clock)

    def source_op(q: PhysicalPlan) -> Any:
        # a streaming worker numbers its sources in node order (its input log's keys)
        number = {n.id: i for i, n in enumerate(m for m in q.pipeline.nodes if m.kind == "source")}

        def make(n: Any) -> SourceOp:
            op = SourceOp(n, q.source_parts[n.id][host.index], host)
            if not op.source.replayable and host.spec.get("input_logs"):
                op.source = _LoggedSource(op.source, number[n.id], host)
            return op

        return make

    hooks = WorkerHooks()
    ops, by_id = build_ops(p, keep, source_op(p), lambda n: sink_op(n, not rewind or n.id in cone), hooks)
    inputs_of: dict[int, list] = {i: [op] for i, op in by_id.items()}
    if rewind:
        old = _load({**host.spec, "pipeline_file": rewind["pipeline_file"], "params": rewind["params"]})
        olds, by_old = build_ops(old, keep, source_op(old), lambda n: sink_op(n, False), hooks)
        for i in keep:
            if i in cone and isinstance(by_id[i], SinkOp):
                continue  # the new output gets every epoch
            if i in cone:
                inputs_of[i] = [by_old[i], by_id[i]]
                by_id[i] = _Switch(by_old[i], by_id[i], rewind["epoch"])
            else:
                inputs_of[i] = [by_old[i]]
                by_id[i] = by_old[i]
        ops = [
            *(op for op in olds if not (op.node.id in cone and isinstance(op, SinkOp))),
            *(op for op in ops if op.node.id in cone),
        ]
    for e in graph_edges(p):
        src, dst = by_id.get(e.src), by_id.get(e.dst)
        if src is not None and dst is not None and not e.exchange:
            src.connect(dst.push, dst.marker, ("f", e.id), dst.event)
        elif src is not None:
            cap = _Capture(host, e, src)
            src.connect(cap.push, cap.marker, None, cap.event)
        if dst is not None:
            for op in inputs_of[e.dst]:
                add_edge_input(op, e, host.workers)
    finish_loops(p, {i: v[0] for i, v in inputs_of.items()})
    if rewind:
        finish_loops(p, {i: v[-1] for i, v in inputs_of.items() if len(v) > 1})
    if host.spec.get("restore") is not None:
        # the instances that run from the checkpoint on: in a rewind, the original pipeline's,
        # and the cone's new sinks (the cone's new operators take over at the rewind's epoch)
        _restore(host, [v[0] for v in inputs_of.values()], p)
    # what counts as committed: the sinks that write (in a rewind, the new cone's)
    host.writers = [op for op in ops if isinstance(op, SinkOp) and (not rewind or op.node.id in cone)]
    return ops, by_id


def _restore(host: _Host, ops: list, p: PhysicalPlan) -> None:
    if host.spec["restore"].get("kind") == "nosync":
        _restore_snapshot(host, ops, p)
    else:
        _restore_checkpoint(host, ops)
    for op in ops:
        if isinstance(op, SinkOp):
            op.committed = 0  # what this job commits; the rewind counts the output it carries


def _read_msgpack(path: str) -> Any:
    with open(path, "rb") as f:
        return msgpack.unpackb(f.read(), raw=False, use_list=False, strict_map_key=False)


def _restore_snapshot(host: _Host, ops: list, p: PhysicalPlan) -> None:
    """Brings `ops` back to worker `host.index`'s snapshot in a consistent cut of a nosync
    run's snapshots (`rewind.find_snapshot_cut`): keyed state as of the snapshot's seq from
    (a copy of) the worker's store, the rest from the snapshot's metadata. The frames in
    flight at the cut are stage 0's to emit (`_sources_task`)."""
    from nosync.modes.nosync import store_state

    r = host.spec["restore"]
    cut = _read_msgpack(r["cut"])
    seq = int(cut["seqs"][host.index])
    metas = cut["ops"][host.index]
    index = {n.name: i for i, n in enumerate(p.pipeline.nodes)}
    path = os.path.join(r["state_dir"], f"w{host.index}", "nosync")
    store = read_store(path)
    try:
        for op in ops:
            meta = metas.get(op.name)
            if meta is None:
                continue
            if isinstance(op, KeyedOp):
                store_state(store, index[op.name], op, seq)
            op.restore_meta(meta)
    finally:
        store.close()


def _restore_checkpoint(host: _Host, ops: list) -> None:
    """Brings `ops` back to an abs checkpoint of a run: keyed state as of the checkpoint's seq
    from (copies of) the run's stores, the rest (source positions, frontiers, watermarks,
    window and join bookkeeping) from its metadata. An operator the checkpoint does not
    name (inside a loop, which holds nothing between two batches) starts as built."""
    from nosync.modes.abs import restore_keyed

    r = host.spec["restore"]
    c = int(r["checkpoint"])
    metas = checkpoints.read(r["path"])["workers"][host.index]["ops"]
    for op in ops:
        meta = metas.get(op.name)
        if meta is None:
            continue
        path = os.path.join(r["state_dir"], f"w{host.index}", op.name)
        if hasattr(op, "take_updates"):
            if not os.path.isdir(path):
                raise NosyncError(
                    f"checkpoint {c} holds keyed state of operator '{op.name}' of worker {host.index}, but its "
                    f"store {path} is missing"
                )
            store = read_store(path)
            try:
                if store.last_seq < c:
                    raise NosyncError(
                        f"the snapshot of checkpoint {c} of operator '{op.name}' of worker {host.index} is missing "
                        f"from its store (a copy of the run's, at {path}, ends at seq {store.last_seq})"
                    )
                restore_keyed(op, store, as_of=c)
            finally:
                store.close()
        op.restore_meta(meta)


def _close(ops: list, host: _Host, s: int) -> None:
    stats: dict[str, int] = {"read": 0, "committed": 0}
    dump = host.spec.get("dump_dir")
    if dump is not None:
        # every operator of the stage as it stands: what a worker restores (mode replay)
        body = {
            op.name: {
                "meta": op.snapshot_meta(),
                "keyed": op.saved_state() if isinstance(op, KeyedOp) else None,
            }
            for op in ops
        }
        path = os.path.join(dump, f"w{host.index}-s{s}.msgpack")
        with open(path + ".tmp", "wb") as f:
            f.write(_pack(body))
        os.replace(path + ".tmp", path)
    want = host.spec.get("state_of")
    for op in ops:
        if want is not None and op.name == want["operator"]:
            keys = want.get("keys")
            items = op.state.items() if keys is None else [(k, op.state[k]) for k in keys if k in op.state]
            for k, v in items:
                try:
                    data = _pack([k, v])
                except (TypeError, ValueError):
                    data = _pack([k, repr(v)])  # shown, not restored: its repr will do
                host.rows.append((host.index, -1, host.index, 0, STATE, 0, data))
        if isinstance(op, SinkOp):
            op.part.close()
            if any(op is w for w in host.writers):
                stats["committed"] += op.committed
        elif isinstance(op, SourceOp):
            stats["read"] += op.records_in
    stats["rows"] = sum(1 for r in host.rows if r[1] >= 0 and r[4] != HERE)
    host.rows.append((host.index, -1, host.index, 0, STATS, 0, _pack(stats)))


def _rows_batch(rows: list[tuple]) -> Any:
    import pyarrow as pa

    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(7)]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols[0], pa.int32()),
            pa.array(cols[1], pa.int32()),
            pa.array(cols[2], pa.int32()),
            pa.array(cols[3], pa.int64()),
            pa.array(cols[4], pa.int8()),
            pa.array(cols[5], pa.int64()),
            pa.array(cols[6], pa.binary()),
        ],
        names=["dest", "edge", "src", "seq", "kind", "epoch", "data"],
    )


def _slots(spark: Any, workers: int) -> Any:
    """A column mapping `dest` to an int whose Spark hash partition is `dest` itself: hash
    partitioning of the destinations themselves may put two in one task (and leave a task
    idle), which would serialize a stage."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    n = 0
    while len(found) < workers:
        cand = spark.range(n, n + 64 * workers).select(F.col("id").cast("int").alias("v"))
        for v, p in cand.select("v", F.expr(f"pmod(hash(v), {workers})")).collect():
            found.setdefault(p, v)
        n += 64 * workers
    pairs = [F.lit(x) for d in range(workers) for x in (d, found[d])]
    return F.element_at(F.create_map(*pairs), F.col("dest"))


def warm_up(spark: Any, workers: int) -> None:
    """Runs one tiny job of each kind the stages use (Arrow in and out of Python, a shuffle to
    the destinations' slots), so that a later job does not pay Spark's first-use costs."""
    rows = spark.range(0, workers, 1, workers).mapInArrow(_echo, "id long")
    rows.withColumn("dest", rows.id.cast("int")).withColumn("slot", _slots(spark, workers)).repartition(
        workers, "slot"
    ).mapInArrow(_echo, "id long, dest int, slot int").collect()


def warm_up_soon(spark: Any, workers: int, what: str) -> None:
    """`warm_up` in a thread of its own (named after `what`), now, on the spare slots: a first
    job a recovery needs does not pay the first-use costs then. A failure is only logged."""
    import logging
    import threading

    def run() -> None:
        try:
            warm_up(spark, workers)
        except Exception:  # noqa: BLE001 - only a warm-up: the recovery will try for real
            logging.getLogger("nosync.spark.batch").warning("warming up batch jobs", exc_info=True)

    threading.Thread(target=run, name=f"nosync-{what}-warm-up", daemon=True).start()


def _echo(batches: Any) -> Any:
    yield from batches


def _load(spec: dict) -> PhysicalPlan:
    from nosync.api.loader import load_pipeline

    return plan(load_pipeline(spec["pipeline_file"], spec["params"]), spec["workers"])


def _fail_fast(task: Any) -> Any:
    """`task` with its error turned into an ERROR row, which the driver raises: a task that
    raised would be retried by Spark as often as a streaming worker may be (`spark_host`)."""

    def run(batches: Any) -> Any:
        try:
            yield from task(batches)
        except Exception as e:
            import traceback

            if isinstance(e, NosyncError):
                text = str(e)  # names the operator or the file itself
            else:
                last = traceback.extract_tb(e.__traceback__)[-1]
                text = f"{type(e).__name__}: {e} (at {last.filename}:{last.lineno})"
            error = {"text": text, "usage": isinstance(e, NosyncError) and not isinstance(e, RunFailed)}
            yield _rows_batch([(-1, -1, -1, 0, ERROR, 0, _pack(error))])

    return run


def _entries(p: PhysicalPlan, stage: dict[int, int]) -> dict[int, int]:
    """Per stage after the first, one edge that enters it from an earlier stage."""
    out: dict[int, int] = {}
    for e in graph_edges(p):
        if stage[e.dst] > stage[e.src]:
            out.setdefault(stage[e.dst], e.id)
    return out


def _read_sources(p: PhysicalPlan, stage: dict[int, int], host: _Host) -> None:
    """Stage 0 on one worker: its sources read to the end (or to epoch `until_epoch`), the
    rows for later stages left in `host.rows`."""
    spec = host.spec
    ops, _ = _task_graph(p, stage, 0, host)
    restore = spec.get("restore")
    if restore is not None and restore.get("kind") == "nosync":
        # what this worker had sent that its receivers had not consumed at the cut
        host.rows.extend(tuple(row) for row in _read_msgpack(restore["inflight"][host.index]))
    if restore is not None:
        # every later stage runs this worker's task, so that its operators hand back
        # their state and close their sinks even if no record or marker reaches them
        for e in _entries(p, stage).values():
            host.rows.append((host.index, e, host.index, 0, HERE, -1, b""))
    sources = [op for op in ops if isinstance(op, SourceOp)]
    until = spec.get("until_epoch")
    busy = True
    while busy:
        busy = False
        for src in sources:
            # stopping after epoch `until` closed: no end of input is sent, so the
            # operators stand as they did at the end of that epoch (windows open)
            if until is None or src.epoch <= until:
                busy = src.poll() or busy
    _close(ops, host, 0)


def _sources_task(spec: dict) -> Any:
    """Stage 0: mapInArrow over the task numbers 0..W-1."""

    @_fail_fast
    def run(batches: Any) -> Any:
        p = _load(spec)
        stage = stages(p)
        for batch in batches:
            for w in batch.column(0).to_pylist():
                host = _Host(int(w), spec["workers"], spec)
                try:
                    _read_sources(p, stage, host)
                finally:
                    host.close()  # the input log it read, if any
                yield _rows_batch(host.rows)

    return run


def _stage_task(spec: dict, s: int) -> Any:
    """Stage s > 0: the rows of one or more destinations, sorted, fed to their operators."""

    @_fail_fast
    def run(batches: Any) -> Any:
        p = _load(spec)
        stage = stages(p)
        edges = {e.id: e for e in p.edges}
        host: _Host | None = None
        ops: list = []
        by_id: dict = {}

        def done() -> Any:
            _close(ops, host, s)
            return _rows_batch(host.rows)

        for batch in batches:
            cols = [batch.column(i).to_pylist() for i in range(7)]
            for dest, edge, src, _seq, kind, epoch, data in zip(*cols, strict=True):
                if host is None or host.index != dest:
                    if host is not None:
                        yield done()
                    host = _Host(dest, spec["workers"], spec)
                    ops, by_id = _task_graph(p, stage, s, host)
                if kind == HERE:
                    continue
                e = edges[edge]
                chan = ("x", edge, src) if e.exchange else ("f", edge)
                op = by_id[e.dst]
                if kind == DATA:
                    op.push(_unpack(data) if e.exchange else statecodec.unpack(data), epoch, chan)
                else:
                    wm, eos = _unpack(data)
                    op.marker(chan, epoch, wm, eos)
        if host is not None:
            yield done()

    return run


def run_batch(
    pipeline_file: str,
    params: dict | None = None,
    workers: int = 2,
    spark: Any = None,
    master: str | None = None,
    epoch_records: int | None = None,
    batch_size: int = 1024,
    run_dir: str | None = None,
) -> dict:
    """Runs the pipeline as Spark batch jobs; returns what it did (stages, seconds, rows)."""
    r, _ = _run(pipeline_file, params, workers, spark, master, epoch_records, batch_size, run_dir, {})
    return r


def keyed_state(
    pipeline_file: str,
    params: dict | None,
    operator: str,
    workers: int = 2,
    epoch_records: int | None = None,
    until_epoch: int | None = None,
    keys: list | None = None,
    spark: Any = None,
    master: str | None = None,
    batch_size: int = 1024,
    run_dir: str | None = None,
    restore: dict | None = None,
    input_logs: str | None = None,
) -> list[tuple[Any, Any]]:
    """(key, state) of every key of keyed operator `operator` at the end of epoch
    `until_epoch` (None: all the input), recomputed by batch jobs; only those of `keys`, if
    given. `restore`: a checkpoint of the run to start from, `input_logs`: a copy of its
    input logs (both from `rewind.choose_start`)."""
    extra = {"state_of": {"operator": operator, "keys": keys}, "until_epoch": until_epoch}
    if restore is not None:
        extra["restore"] = restore
    if input_logs is not None:
        extra["input_logs"] = input_logs
    _, state = _run(pipeline_file, params, workers, spark, master, epoch_records, batch_size, run_dir, extra)
    return state


def recompute_states(
    pipeline_file: str,
    params: dict | None,
    workers: int,
    epoch_records: int | None,
    until_epoch: int,
    dump_dir: str,
    spark: Any,
    batch_size: int = 1024,
) -> dict:
    """Recomputes every operator instance of the pipeline as it stood at the end of epoch
    `until_epoch` and writes them, per worker and stage, under `dump_dir`
    (`w<worker>-s<stage>.msgpack`: operator name -> its meta and keyed state)."""
    os.makedirs(dump_dir, exist_ok=True)
    extra = {"dump_dir": os.path.abspath(dump_dir), "until_epoch": until_epoch}
    r, _ = _run(pipeline_file, params, workers, spark, None, epoch_records, batch_size, dump_dir, extra)
    return r


def load_states(dump_dir: str, worker: int) -> dict:
    """What `recompute_states` wrote for `worker`: operator name -> {"meta", "keyed"}."""
    out: dict = {}
    for name in sorted(os.listdir(dump_dir)):
        if name.startswith(f"w{worker}-s") and name.endswith(".msgpack"):
            with open(os.path.join(dump_dir, name), "rb") as f:
                out.update(msgpack.unpackb(f.read(), raw=False, use_list=False, strict_map_key=False))
    return out


def _run(
    pipeline_file: str,
    params: dict | None,
    workers: int,
    spark: Any,
    master: str | None,
    epoch_records: int | None,
    batch_size: int,
    run_dir: str | None,
    extra: dict,
) -> tuple[dict, list]:
    from nosync.api.loader import load_pipeline
    from nosync.spark.session import get_spark

    if workers < 1:
        raise NosyncError(f"--workers must be at least 1, got {workers}")
    pipeline = load_pipeline(pipeline_file, params)
    p = plan(pipeline, workers)
    if not extra.get("input_logs"):
        require_replayable(pipeline, "a batch job", "Spark may run a task again")
    stage = stages(p)
    last = max(stage.values())
    want = extra.get("state_of")
    if want is not None:
        node = next((n for n in pipeline.nodes if n.name == want["operator"]), None)
        if node is None:
            names = ", ".join(n.name for n in pipeline.nodes)
            raise PipelineError(f"no operator named '{want['operator']}'; operators: {names}")
        if node.kind not in KEYED_KINDS:
            raise PipelineError(
                f"operator '{node.name}' is a {node.kind}: it keeps no keyed state", node.name, node.where
            )
        last = stage[node.id]
    run_dir = run_dir or os.path.join("runs", f"batch-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(run_dir, exist_ok=True)
    spec = {
        "pipeline_file": os.path.abspath(pipeline_file),
        "params": dict(params or {}),
        "workers": workers,
        "batch_size": batch_size,
        "epoch_records": epoch_records or DEFAULT_EPOCH_RECORDS,
        "run_dir": os.path.abspath(run_dir),
        "run_id": uuid.uuid4().hex,
        "on_bad_record": "deadletter",
        **extra,
    }
    if spark is None:
        spark = get_spark(master, workers, app="nosync-batch")
    t0 = time.time()
    outputs: list[Any] = []
    rows = []
    stage_s = []
    totals = {"read": 0, "committed": 0}
    state: list = []
    ids = spark.range(0, workers, 1, workers)
    slot = _slots(spark, workers)
    for s in range(last + 1):
        ts = time.time()
        if s == 0:
            out = ids.mapInArrow(_sources_task(spec), SCHEMA)
        else:
            into = [e.id for e in graph_edges(p) if stage[e.dst] == s and stage[e.src] < s]
            parts = [df.where(df.edge.isin(into)) for df in outputs]
            df = parts[0]
            for more in parts[1:]:
                df = df.unionAll(more)
            df = df.withColumn("slot", slot).repartition(workers, "slot").drop("slot")
            df = df.sortWithinPartitions("dest", "epoch", "src", "edge", "seq")
            out = df.mapInArrow(_stage_task(spec, s), SCHEMA)
        if s < last:
            # materialized by the first action below, once: later stages read it, never rerun it
            out = out.localCheckpoint(eager=False)
        totals["rows"] = 0
        for kind, data in out.where(out.edge < 0).select("kind", "data").collect():
            if kind == STATS:
                for k, v in _unpack(data).items():
                    totals[k] += v
            elif kind == ERROR:
                e = _unpack(data)
                what = f"stage {s} of the batch jobs: {e['text']}"
                raise NosyncError(what) if e["usage"] else RunFailed(what)
            else:
                state.append(tuple(_unpack(data)))
        rows.append(totals.pop("rows"))
        outputs.append(out)
        stage_s.append(time.time() - ts)
    return {
        "stages": last + 1,
        "rows": rows,
        "stage_s": stage_s,
        "seconds": time.time() - t0,
        "run_dir": run_dir,
        **totals,
    }, state

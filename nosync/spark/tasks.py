"""The tasks of the batch jobs (`nosync.spark.batch`): each runs one stage of the pipeline's
operators for one destination worker, over Arrow batches of rows; rows carry records,
markers, stats, state and errors between stages and back to the driver."""

from __future__ import annotations

import os
import traceback
from typing import Any

from nosync import codec
from nosync.api import sinks
from nosync.api.loader import spec_pipeline
from nosync.api.plan import PhysicalPlan, plan
from nosync.errors import BadRecord, NosyncError, RunFailed
from nosync.runtime import frames
from nosync.runtime.dead_letters import DeadLetters
from nosync.runtime.graph import (
    add_edge_input,
    build_ops,
    connect_back_edge,
    finish_loops,
    graph_edges,
    partition_of,
)
from nosync.runtime.heap import thaw
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.keyed import KeyedOp
from nosync.runtime.loops import ROUND_BITS, LoopHead
from nosync.runtime.operators import EOS, SinkOp
from nosync.runtime.source_op import SourceOp
from nosync.spark.stages import dump_ops, resume_round, round_nodes, round_path, stage_entries, stages
from nosync.state import checkpoints
from nosync.state.checkpoints import restore_keyed
from nosync.state.inputlog import InputLog
from nosync.state.layout import store_state
from nosync.state.stores import read_store

SCHEMA = "dest int, edge int, src int, seq long, kind tinyint, epoch long, data binary"
DATA, MARK, STATS, STATE, ERROR, HERE, DEAD = 0, 1, 2, 3, 4, 5, 6
"""Row kinds: records, a progress marker, one row per task of what it read and committed,
(key, state) pairs of the operator asked for, the error a task stopped on, a record a source
could not read (edge -1: no stage reads these four; the driver writes the dead letters), and a
row that only makes a later stage run a destination's task (a restored run can leave a
destination nothing else: its inputs ended before the cut)."""


def _pack_forward(records: list, sender: str) -> bytes:
    try:
        return codec.pack_state(records)
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
        self.dead_letters = DeadLetters.of_spec(
            lambda letter: self.rows.append((index, -1, index, 0, DEAD, 0, codec.pack([index, letter]))), spec
        )
        self.rows: list[tuple] = []
        self.switches: list[_Switch] = []
        """A rewind's operators of the cone: the original's instance, then the new one."""
        self.seq = 0
        self.writers: list = []
        self._inputs: Any = None

    def dead_letter(self, op_name: str, bad: BadRecord) -> None:
        """A source could not read a record: it goes to the run's dead letters, as a worker's do."""
        self.dead_letters.write(op_name, bad)

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
        if self.edge.feedback:
            # a loop's back edge: the records kept go back to the head of their own worker
            self._row(h.index, DATA, epoch, frames.pack_records(records, self.sender))
            return
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
        data = codec.pack([wm, eos])
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
        self.name, self.node = old.name, old.node

    @property
    def switched(self) -> bool:
        """Whether the new pipeline's instance has taken over."""
        return self.cur is self.new

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

    def connect_back(self, *args: Any) -> None:
        self.old.connect_back(*args)
        self.new.connect_back(*args)


def _task_graph(p: PhysicalPlan, stage: dict[int, int], s: int, host: _Host, k: int = 0) -> tuple[list, dict]:
    """The operators of stage `s` on `host`, wired: forward edges inside the stage call
    through, edges leaving it go to captures, edges entering it get their channels. For a
    rewind, `p` is the new pipeline: in the cone its instances take over from the original's
    at the rewind's epoch, and its sinks write everything; elsewhere the original pipeline
    runs, and its sinks write nothing. In round `k` > 0 of a loop's jobs, only the loops'
    operators run: the others of the stage took all their input in round 0."""
    keep = {i for i, st in stage.items() if st == s}
    if k:
        keep &= round_nodes(p)
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
        old = _load(
            {
                **host.spec,
                "pipeline_file": rewind["pipeline_file"],
                "pipeline_source": rewind.get("pipeline_source"),
                "params": rewind["params"],
            }
        )
        olds, by_old = build_ops(old, keep, source_op(old), lambda n: sink_op(n, False), hooks)
        for i in keep:
            if i in cone and isinstance(by_id[i], SinkOp):
                continue  # the new output gets every epoch
            if i in cone:
                inputs_of[i] = [by_old[i], by_id[i]]
                # inside a loop, operators see waves: the first of the rewind's epoch
                inside = p.pipeline.nodes[i].params.get("loop_internal")
                at = rewind["epoch"] << ROUND_BITS if inside else rewind["epoch"]
                by_id[i] = _Switch(by_old[i], by_id[i], at)
                host.switches.append(by_id[i])
            else:
                inputs_of[i] = [by_old[i]]
                by_id[i] = by_old[i]
        ops = [
            *(op for op in olds if not (op.node.id in cone and isinstance(op, SinkOp))),
            *(op for op in ops if op.node.id in cone),
        ]
    for e in graph_edges(p):
        src, dst = by_id.get(e.src), by_id.get(e.dst)
        if e.feedback:
            if src is not None and dst is not None and not e.exchange:
                connect_back_edge(e, src, dst)
            elif src is not None:
                # the body crosses workers: what goes back round is for the loop's next round of jobs
                cap = _Capture(host, e, src)
                src.connect_back(cap.push, cap.marker, cap.event)
        elif src is not None and dst is not None and not e.exchange:
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
    if host.spec.get("restore") is not None and not k:
        # the instances that run from the checkpoint on: in a rewind, the original pipeline's,
        # and the cone's new sinks (the cone's new operators take over at the rewind's epoch);
        # a loop's later rounds start from the round before instead (a restore would replay its
        # back-edge log into the loop once more)
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


def _restore_snapshot(host: _Host, ops: list, p: PhysicalPlan) -> None:
    """Brings `ops` back to worker `host.index`'s snapshot in a consistent cut of a nosync
    run's snapshots (`starts.find_snapshot_cut`): keyed state as of the snapshot's seq from
    (a copy of) the worker's store, the rest from the snapshot's metadata. The frames in
    flight at the cut are stage 0's to emit (`_sources_task`)."""
    r = host.spec["restore"]
    cut = codec.read_file(r["cut"])
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
    for op in ops:
        if isinstance(op, LoopHead):
            # every operator holds the checkpoint's state: what the back edges carried goes round again
            op.replay_log()


def _close(ops: list, host: _Host, s: int, k: int | None = None) -> None:
    stats: dict[str, int] = {"read": 0, "committed": 0}
    if k is not None:
        dump_ops(ops, round_path(host.spec, host.index, s, k), host.switches)
    dump = host.spec.get("dump_dir")
    if dump is not None:
        # every operator of the stage as it stands: what a worker restores (mode replay); a
        # loop's rounds each leave theirs, the later ones holding only the loops' operators
        # (`load_states` reads them in order: the last round of an operator wins)
        name = f"w{host.index}-s{s}" + ("" if k is None else f"-r{k:06d}")
        dump_ops(ops, os.path.join(dump, name + ".msgpack"))
    want = host.spec.get("state_of")
    for op in ops:
        if want is not None and op.name == want["operator"]:
            keys = want.get("keys")
            items = op.state.items() if keys is None else [(k, op.state[k]) for k in keys if k in op.state]
            for k, v in items:
                try:
                    data = codec.pack([k, v])
                except (TypeError, ValueError):
                    data = codec.pack([k, repr(v)])  # shown, not restored: its repr will do
                host.rows.append((host.index, -1, host.index, 0, STATE, 0, data))
        if isinstance(op, SinkOp):
            op.part.sync()
            op.part.close()
            if any(op is w for w in host.writers):
                stats["committed"] += op.committed
        elif isinstance(op, SourceOp):
            stats["read"] += op.records_in
    stats["rows"] = sum(1 for r in host.rows if r[1] >= 0 and r[4] != HERE)
    host.rows.append((host.index, -1, host.index, 0, STATS, 0, codec.pack(stats)))


def rows_batch(rows: list[tuple]) -> Any:
    """The Arrow batch of `rows`, with the columns dest, edge, src, seq, kind, epoch, data."""
    import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

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


def echo(batches: Any) -> Any:
    """Yields the batches it is given (a task that does nothing, for warming Spark up)."""
    yield from batches


def _load(spec: dict) -> PhysicalPlan:
    return plan(spec_pipeline(spec), spec["workers"])


def fail_fast(task: Any) -> Any:
    """`task` with its error turned into an ERROR row, which the driver raises: a task that
    raised would be retried by Spark as often as a streaming worker may be (`spark_host`)."""

    def run(batches: Any) -> Any:
        try:
            yield from task(batches)
        except Exception as e:
            if isinstance(e, NosyncError):
                text = str(e)  # names the operator or the file itself
            else:
                last = traceback.extract_tb(e.__traceback__)[-1]
                text = f"{type(e).__name__}: {e} (at {last.filename}:{last.lineno})"
            error = {"text": text, "usage": isinstance(e, NosyncError) and not isinstance(e, RunFailed)}
            yield rows_batch([(-1, -1, -1, 0, ERROR, 0, codec.pack(error))])
        finally:
            thaw()  # what a restore froze (`build_long_lived`): a reused Python worker runs other tasks

    return run


def _read_sources(p: PhysicalPlan, stage: dict[int, int], host: _Host) -> None:
    """Stage 0 on one worker: its sources read to the end (or to epoch `until_epoch`), the
    rows for later stages left in `host.rows`."""
    spec = host.spec
    ops, _ = _task_graph(p, stage, 0, host)
    restore = spec.get("restore")
    if restore is not None and restore.get("kind") == "nosync":
        # what this worker had sent that its receivers had not consumed at the cut
        host.rows.extend(tuple(row) for row in codec.read_file(restore["inflight"][host.index]))
    if restore is not None:
        # every later stage runs this worker's task, so that its operators hand back
        # their state and close their sinks even if no record or marker reaches them
        for e in stage_entries(p, stage).values():
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


def sources_task(spec: dict) -> Any:
    """Stage 0: mapInArrow over the task numbers 0..W-1."""

    @fail_fast
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
                yield rows_batch(host.rows)

    return run


def stage_task(spec: dict, s: int, k: int | None = None) -> Any:
    """Stage s > 0: the rows of one or more destinations, sorted, fed to their operators.
    In round `k` of a loop's jobs, the operators start as round k - 1 left them, and are
    left for round k + 1."""

    @fail_fast
    def run(batches: Any) -> Any:
        p = _load(spec)
        stage = stages(p)
        edges = {e.id: e for e in p.edges}
        host: _Host | None = None
        ops: list = []
        by_id: dict = {}

        def done() -> Any:
            _close(ops, host, s, k)
            return rows_batch(host.rows)

        for batch in batches:
            cols = [batch.column(i).to_pylist() for i in range(7)]
            for dest, edge, src, _seq, kind, epoch, data in zip(*cols, strict=True):
                if host is None or host.index != dest:
                    if host is not None:
                        yield done()
                    host = _Host(dest, spec["workers"], spec)
                    # rows of later rounds sort after the earlier rounds' on their link
                    host.seq = (k or 0) << 40
                    ops, by_id = _task_graph(p, stage, s, host, k or 0)
                    if k:
                        resume_round(host, ops, s, k)
                if kind == HERE:
                    continue
                e = edges[edge]
                chan = ("x", edge, src) if e.exchange else ("f", edge)
                op = by_id[e.dst]
                if kind == DATA:
                    op.push(codec.unpack(data) if e.exchange else codec.unpack_state(data), epoch, chan)
                else:
                    wm, eos = codec.unpack(data)
                    op.marker(chan, epoch, wm, eos)
        if host is not None:
            yield done()

    return run

"""A pipeline over bounded input as Spark batch jobs, stage by stage.

A stage is what lies between exchanges: the stage of an operator is the greatest number of
exchange edges on a path from a source to it. A loop whose body holds no exchange lies inside
one stage; a loop whose body crosses workers has stages of its own, run as rounds of jobs
until a round sends nothing back round the loop (`run_rounds`).

Stage 0 is W Spark tasks, task w reading the source partitions that streaming worker w would
read; every later stage is one Spark job over what earlier stages sent it, shuffled by
destination (the same xxhash partitioning of keys as the streaming routers) and sorted, per
destination, by (epoch, sending task, edge, order of emission).

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

import logging
import os
import threading
import time
import uuid
from typing import Any

from nosync import codec, storage
from nosync.api.loader import load_pipeline, pipeline_source
from nosync.api.pipeline import KEYED_KINDS, require_replayable
from nosync.api.plan import plan
from nosync.errors import NosyncError, PipelineError, RunFailed
from nosync.runtime.dead_letters import MAX_DEAD_LETTERS, DeadLetterFile, dead_letter_path
from nosync.runtime.graph import graph_edges
from nosync.spark.session import get_spark
from nosync.spark.stages import loop_blocks, stage_entries, stages
from nosync.spark.tasks import DEAD, ERROR, HERE, SCHEMA, STATS, echo, sources_task, stage_task

DEFAULT_EPOCH_RECORDS = 10_000


def epoch_records_of(run: dict) -> int:
    """The records per source partition that cut the epochs of a run (its run.json)."""
    return int(run.get("epoch_records") or DEFAULT_EPOCH_RECORDS)


def _slots(spark: Any, workers: int) -> Any:
    """A column mapping `dest` to an int whose Spark hash partition is `dest` itself: hash
    partitioning of the destinations themselves may put two in one task (and leave a task
    idle), which would serialize a stage."""
    from pyspark.sql import functions as F  # lazy: pyspark costs ~1 s to import and only this path needs it

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
    rows = spark.range(0, workers, 1, workers).mapInArrow(echo, "id long")
    rows.withColumn("dest", rows.id.cast("int")).withColumn("slot", _slots(spark, workers)).repartition(
        workers, "slot"
    ).mapInArrow(echo, "id long, dest int, slot int").collect()


def warm_up_soon(spark: Any, workers: int, what: str) -> None:
    """`warm_up` in a thread of its own (named after `what`), now, on the spare slots: a first
    job a recovery needs does not pay the first-use costs then. A failure is only logged."""

    def run() -> None:
        try:
            warm_up(spark, workers)
        except Exception:  # noqa: BLE001 - only a warm-up: the recovery will try for real
            logging.getLogger("nosync.spark.batch").warning("warming up batch jobs", exc_info=True)

    threading.Thread(target=run, name=f"nosync-{what}-warm-up", daemon=True).start()


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
    r, _ = run_jobs(pipeline_file, params, workers, spark, master, epoch_records, batch_size, run_dir, {})
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
    _, state = run_jobs(pipeline_file, params, workers, spark, master, epoch_records, batch_size, run_dir, extra)
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
    run_dir: str | None = None,
    max_dead_letters: int | None = MAX_DEAD_LETTERS,
) -> dict:
    """Recomputes every operator instance of the pipeline as it stood at the end of epoch
    `until_epoch` and writes them, per worker and stage, under `dump_dir` (a path or URI the
    workers reach: `w<worker>-s<stage>.msgpack`, operator name -> its meta and keyed state).
    The records its sources cannot read go to the dead letters of the run in `run_dir`, at most
    `max_dead_letters` a worker (the run's --max-dead-letters)."""
    dump_dir = _place(dump_dir)
    storage.makedirs(dump_dir)
    extra = {"dump_dir": dump_dir, "until_epoch": until_epoch, "max_dead_letters": max_dead_letters}
    r, _ = run_jobs(
        pipeline_file, params, workers, spark, None, epoch_records, batch_size, dump_dir, extra, dead_letters=run_dir
    )
    return r


def load_states(dump_dir: str, worker: int) -> dict:
    """What `recompute_states` wrote for `worker`: operator name -> {"meta", "keyed"}."""
    out: dict = {}
    for name in storage.listdir(dump_dir):
        if name.startswith(f"w{worker}-s") and name.endswith(".msgpack"):
            out.update(codec.read_file(storage.join(dump_dir, name)))
    return out


def _place(where: str) -> str:
    """`where` as the tasks of a batch job take it: a URI as it is, a path made absolute."""
    return where if storage.is_uri(where) else os.path.abspath(where)


def run_rounds(
    spark: Any,
    spec: dict,
    p: Any,
    stage: dict[int, int],
    a: int,
    b: int,
    back: list[int],
    outputs: list,
    stage_input: Any,
    collect: Any,
    state: list,
    rounds: list,
) -> list:
    """Stages a..b, which hold loops whose body crosses workers, as rounds of jobs: round 0
    takes what earlier stages sent them; each later round takes what the tails sent back in
    the one before (the records kept and the tails' reports, the loops' back edges), its
    operators starting as the round before left them, until a round sends nothing back.
    Returns the rounds' outputs, for the stages after b."""
    from pyspark.sql import functions as F  # lazy: see `_slots`

    workers = spec["workers"]
    # rows that make every destination's task of every stage run in every round: its
    # operators carry their state from round to round even when nothing reaches them
    entry = stage_entries(p, stage)
    here = spark.createDataFrame(
        [(w, entry[st], w, 0, HERE, -1, b"") for st in range(a, b + 1) if st in entry for w in range(workers)],
        SCHEMA,
    ).localCheckpoint(eager=True)
    storage.makedirs(spec["rounds_dir"])
    produced: list = []
    latest: dict[int, list] = {}
    came_back = None
    k = 0
    while True:
        this_round: dict[int, Any] = {}
        for st in range(a, b + 1):
            st_entry = entry.get(st)
            extra = [here.where(here.edge == st_entry)] if st_entry is not None else []
            if st == a and came_back is not None:
                extra.append(came_back)
            if st == a and k == 0:
                # what was on the back edges at a restored cut (a nosync run's frames in flight)
                extra.extend(df.where(F.col("edge").isin(back)) for df in outputs)
            earlier = (outputs if k == 0 else []) + list(this_round.values())
            out = stage_input(st, earlier, extra).mapInArrow(stage_task(spec, st, k), SCHEMA)
            out = out.localCheckpoint(eager=False)
            got = collect(out, st)
            if got:
                latest[st] = got  # the state asked for, as this round left it
            this_round[st] = out
        produced.extend(this_round.values())
        came_back = this_round[b].where(F.col("edge").isin(back)).localCheckpoint(eager=True)
        k += 1
        if came_back.limit(1).count() == 0:
            break
    rounds.append(k)
    for got in latest.values():
        state.extend(got)
    return produced


def run_jobs(
    pipeline_file: str,
    params: dict | None,
    workers: int,
    spark: Any,
    master: str | None,
    epoch_records: int | None,
    batch_size: int,
    run_dir: str | None,
    extra: dict,
    dead_letters: str | None = None,
) -> tuple[dict, list]:
    """Runs the pipeline as Spark batch jobs, stage by stage (`extra` goes into the tasks' spec);
    returns the totals and the state rows collected. `run_dir` (a path or a URI every task
    reaches) holds what the jobs hand each other; the records the sources cannot read go to
    the dead-letter files in `dead_letters` (a local directory; default `run_dir`, when that
    is local)."""
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
    run_dir = _place(run_dir or os.path.join("runs", f"batch-{time.strftime('%Y%m%d-%H%M%S')}"))
    storage.makedirs(run_dir)
    if dead_letters is None and storage.is_local(run_dir):
        dead_letters = storage.local_path(run_dir)
    letters: dict[int, DeadLetterFile] = {}
    spec = {
        "pipeline_file": os.path.abspath(pipeline_file),
        "pipeline_source": pipeline_source(pipeline_file),
        "params": dict(params or {}),
        "workers": workers,
        "batch_size": batch_size,
        "epoch_records": epoch_records or DEFAULT_EPOCH_RECORDS,
        "run_dir": run_dir,
        "run_id": uuid.uuid4().hex,
        "on_bad_record": "deadletter",
        "max_dead_letters": MAX_DEAD_LETTERS,
        **extra,
    }
    if spark is None:
        spark = get_spark(master, workers, app="nosync-batch")
    t0 = time.time()
    outputs: list[Any] = []
    rows: list = []
    rounds: list = []
    stage_s = []
    totals = {"read": 0, "committed": 0}
    state: list = []
    ids = spark.range(0, workers, 1, workers)
    slot = _slots(spark, workers)
    blocks = {a: (b, back) for a, b, back in loop_blocks(p, stage)}
    if want is not None:
        for a, (b, _) in blocks.items():
            if a <= last <= b:
                last = b  # the operator is in a loop's stages: its state is what the last round leaves
    spec["rounds_dir"] = storage.join(run_dir, "_rounds")

    def stage_input(s: int, earlier: list, extra: list) -> Any:
        into = [e.id for e in graph_edges(p) if stage[e.dst] == s and stage[e.src] < s and not e.feedback]
        parts = [df.where(df.edge.isin(into)) for df in earlier] + extra
        df = parts[0]
        for more in parts[1:]:
            df = df.unionAll(more)
        df = df.withColumn("slot", slot).repartition(workers, "slot").drop("slot")
        return df.sortWithinPartitions("dest", "epoch", "src", "edge", "seq")

    def collect(out: Any, s: int) -> list:
        """Raises a task's error, adds up the stats; returns the state rows."""
        got = []
        totals["rows"] = 0
        for kind, data in out.where(out.edge < 0).select("kind", "data").collect():
            if kind == STATS:
                for k, v in codec.unpack(data).items():
                    totals[k] += v
            elif kind == ERROR:
                e = codec.unpack(data)
                what = f"stage {s} of the batch jobs: {e['text']}"
                raise NosyncError(what) if e["usage"] else RunFailed(what)
            elif kind == DEAD:
                if dead_letters is not None:
                    w, letter = codec.unpack(data)
                    if w not in letters:
                        letters[w] = DeadLetterFile(dead_letter_path(dead_letters, w), spec["max_dead_letters"])
                    try:
                        letters[w].add(letter)
                    except RunFailed as e:
                        raise RunFailed(f"worker {w}: {e}") from None
            else:
                got.append(tuple(codec.unpack(data)))
        rows.append(totals.pop("rows"))
        return got

    try:
        s = 0
        while s <= last:
            ts = time.time()
            if s in blocks:
                b, back = blocks[s]
                outputs.extend(
                    run_rounds(spark, spec, p, stage, s, b, back, outputs, stage_input, collect, state, rounds)
                )
                stage_s.append(time.time() - ts)
                s = b + 1
                continue
            if s == 0:
                out = ids.mapInArrow(sources_task(spec), SCHEMA)
            else:
                out = stage_input(s, outputs, []).mapInArrow(stage_task(spec, s), SCHEMA)
            if s < last:
                # materialized by the first action below, once: later stages read it, never rerun it
                out = out.localCheckpoint(eager=False)
            state.extend(collect(out, s))
            outputs.append(out)
            stage_s.append(time.time() - ts)
            s += 1
    finally:
        for f in letters.values():
            f.close()
    return {
        "stages": last + 1,
        "loop_rounds": rounds,
        "rows": rows,
        "stage_s": stage_s,
        "seconds": time.time() - t0,
        "run_dir": run_dir,
        **totals,
    }, state

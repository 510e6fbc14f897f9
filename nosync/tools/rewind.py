"""Rewind: re-execute an operator and its downstream cone from a past epoch, with the same
or a changed pipeline, into a separate output.

The cone of operator X is X and every operator downstream of it (`lineage.rewind_plan`).
The rewind restores the cone to the state just before epoch E and re-executes epochs E on,
as Spark batch jobs (`nosync/spark/batch.py`): the original pipeline's instances run up to the end
of epoch E - 1, then, in the cone, the new pipeline's instances take over their state,
frontiers and watermarks and run on. Operators outside the cone run the original code
throughout. Only the cone's sinks write, into the new output, which holds a whole output of
one execution that `nosync diff` compares with the run's.

Where the jobs start (`restore_from`; "auto", the default, takes the run's own state, a
checkpoint or a cut of snapshots, when there is one to take):
- "checkpoint": for a run in mode abs, the latest retained checkpoint of the run whose cut
  lies at or before the start of epoch E, said explicitly. Its keyed state is read from
  copies of the run's stores as of the checkpoint's seq, its positions and frontiers from its
  metadata; the sources read only what follows its cut. The new output starts with the run's
  output committed up to that checkpoint (its files carry the checkpoint in their names), and
  the jobs write what follows. The window is what the run retained: `abs.KEEP_FILES`
  checkpoint files, and store versions back `abs.RETENTION` checkpoints. With no usable
  checkpoint at or before E, "auto" recomputes from the sources and says why; "checkpoint"
  refuses.
- "checkpoint" for a run in mode nosync: the newest consistent cut of the workers' own
  snapshots at which no source partition had read a record of epoch E
  (`find_snapshot_cut`): one snapshot per worker, no snapshot having consumed a frame its
  sender's had not produced. Keyed state is read from copies of the workers' stores as of
  each snapshot's step, the rest from the snapshot's metadata; the frames in flight at the
  cut, read from the senders' output logs, are fed to the stages that consume them before
  anything else on their link. The new output starts with the run's files each worker had
  pre-committed up to its snapshot. The window is what the stores retained: each worker's
  snapshots of the last `RETENTION_S` seconds (`nosync/modes/nosync/snapshots.py`) at least.
- "sources" (what "auto" takes for modes none and replay): the jobs read the sources from
  the start. Every epoch the sources can read again can be rewound to.

What "epoch" means for an output. The batch jobs process epochs in order, so what they emit
for epoch e is what epoch e's input caused. A run in mode replay aligns epochs the same way,
so the rewound output of a replay run equals the run's, epoch by epoch, before E (and after,
with the same pipeline). The other modes let an instance run ahead on one input: it emits
with the greatest epoch it has seen, so some of the run's records sit one epoch later than in
the rewound output; the outputs are then equal as wholes, not epoch by epoch.

A source that cannot restart from a position (TcpLines) is read back from the input log a
nosync run keeps of it (a copy); a run in another mode cannot be rewound past one.

Nothing in the run directory is changed: stores are copied before they are opened.

The new pipeline must be the same graph (names, kinds, inputs) as the original; outside the
cone its functions must be the original's too. A sink takes its directory from the
parameter `output`, which the rewind sets to the new output.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from lineage import rewind_plan
from lsm import LsmError
from nosync import codec, storage
from nosync.api import sinks
from nosync.api.loader import load_pipeline, pipeline_source
from nosync.api.pipeline import Pipeline
from nosync.errors import NosyncError, PipelineError
from nosync.spark.batch import epoch_records_of, run_jobs
from nosync.state.layout import INPUT
from nosync.tools.starts import (
    BUFFERED_SEQ,
    committed_epochs,
    find_checkpoint_before,
    find_snapshot_cut,
    stores_hold,
)
from nosync.tools.stores import copy_stores, local_stores, run_places

RESTORE_FROM = ("auto", "checkpoint", "sources")


def _check_restore_from(value: str) -> None:
    if value not in RESTORE_FROM:
        raise NosyncError(f"--restore-from must be one of {', '.join(RESTORE_FROM)}, got '{value}'")


FUNCTION_PARAMS = ("fn", "add", "init", "keep", "time", "key")


def _code(f: Any) -> Any:
    c = getattr(f, "__code__", None)
    return None if c is None else (c.co_code, c.co_consts, c.co_names)


def check_compatible(old: Pipeline, new: Pipeline, cone: set[str]) -> None:
    """Refuses a new pipeline that is not the original's graph, or that changes an operator
    outside the cone, naming the operator."""
    if new.name != old.name:
        raise PipelineError(f"the new pipeline is '{new.name}', the run's is '{old.name}'")
    names_old = [n.name for n in old.nodes]
    names_new = [n.name for n in new.nodes]
    if names_old != names_new:
        missing = [n for n in names_old if n not in names_new] or [n for n in names_new if n not in names_old]
        what = missing[0] if missing else names_new[0]
        raise PipelineError(
            f"the new pipeline's operators differ from the run's at '{what}' "
            f"(run: {', '.join(names_old)}; new: {', '.join(names_new)})"
        )
    for a, b in zip(old.nodes, new.nodes, strict=True):
        ins_a = [old.nodes[i].name for i in a.inputs]
        ins_b = [new.nodes[i].name for i in b.inputs]
        if a.kind != b.kind or ins_a != ins_b:
            raise PipelineError(
                f"operator '{a.name}' is a {a.kind} reading {ins_a} in the run, a {b.kind} reading {ins_b} in the "
                "new pipeline: a rewind keeps the graph",
                b.name,
                b.where,
            )
        if a.name in cone:
            continue
        for p in FUNCTION_PARAMS:
            if _code(a.params.get(p)) != _code(b.params.get(p)):
                raise PipelineError(
                    f"operator '{a.name}' is outside the rewound cone ({', '.join(sorted(cone))}) but its "
                    f"function `{p}` changed",
                    b.name,
                    b.where,
                )


def _carry_blocker(old: Pipeline, new: Pipeline, cone: set[str]) -> str | None:
    """Why the new output cannot start with the run's output up to a checkpoint, or None: a
    cone sink of the run that keeps no files per checkpoint, or a Files sink of the run whose
    counterpart in the new pipeline is not one."""
    for a, b in zip(old.nodes, new.nodes, strict=True):
        if a.kind != "sink" or a.name not in cone or isinstance(a.params["sink"], sinks.Null):
            continue
        if not isinstance(a.params["sink"], sinks.Files):
            return f"sink '{a.name}' keeps no output files per checkpoint to start the new output from"
        if not isinstance(b.params["sink"], sinks.Files):
            return f"sink '{a.name}' writes files in the run but not in the new pipeline: the run's cannot be carried"
    return None


def _carry_output(old: Pipeline, new: Pipeline, cone: set[str], upto: dict[int, int], ops: dict) -> int:
    """Copies into the new output the run's output files of the cone's Files sinks up to the
    cut: worker w's committed part files named with a checkpoint or snapshot step <=
    `upto[w]`, and the staged files that its pre-commits up to there name (`ops[w]`, the
    operators' metadata at the cut: the run committed them later, or would have). Other
    staged files (a pre-commit whose snapshot never became durable) are left. Returns how
    many files."""
    n = 0
    for a, b in zip(old.nodes, new.nodes, strict=True):
        if a.kind != "sink" or a.name not in cone or not isinstance(a.params["sink"], sinks.Files):
            continue
        src, dst = a.params["sink"].directory, b.params["sink"].directory
        os.makedirs(dst, exist_ok=True)
        names = []
        for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
            m = sinks.PART_NAME.match(name)
            if m and m.group(3) is not None and int(m.group(3)) <= upto.get(int(m.group(2)), -1):
                names.append((src, name))
        for w, metas in ops.items():
            for c, handle in (metas.get(a.name) or {}).get("precommitted", ()):
                if int(c) <= upto[int(w)]:
                    names.extend((os.path.join(src, "_staging"), name) for name in handle["files"])
        for d, name in names:
            if os.path.exists(os.path.join(d, name)) and not os.path.exists(os.path.join(dst, name)):
                shutil.copy2(os.path.join(d, name), os.path.join(dst, name))
                n += 1
    return n


def _copy_state(run_dir: str, run: dict, scratch: str) -> str | None:
    """A copy of the run's stores under `scratch` (`tools.stores.copy_stores`: opening one
    recovers its LevelDB log, which would rewrite the run's files), or None if the run has none."""
    return copy_stores(run_dir, run, os.path.join(scratch, "state"))


def _copy_input_logs(run_dir: str, run: dict, pipeline: Pipeline, scratch: str, stores: str | None) -> str | None:
    """For a nosync run with a source that cannot restart from a position: the copy of the
    run's stores, with the input logs its workers kept of such sources, which the batch jobs
    read in its place (`batch._LoggedSource`): `stores`, the copy the jobs start from
    (`_copy_state`), when there is one, else a copy made under `scratch`; None for a pipeline
    without one. Raises NosyncError for a run that kept no input log."""
    live = [n for n in pipeline.nodes if n.kind == "source" and not n.params["source"].replayable]
    if not live:
        return None
    what = f"{live[0].params['source'].describe()} (operator '{live[0].name}') cannot restart from a position"
    if run.get("mode") != "nosync":
        raise NosyncError(
            f"{what}, and only a run in mode nosync keeps an input log to read it back from: {run_dir} is a run in "
            f"mode {run.get('mode')}"
        )
    copy = stores or copy_stores(run_dir, run, os.path.join(scratch, "inputs"))
    if copy is None or not any(name == INPUT for _, name, _ in local_stores(copy)):
        raise NosyncError(f"{what}, and {run_dir} holds no input log (state/w<worker>/input) to read it back from")
    return copy


def choose_start(
    run_dir: str,
    run: dict,
    pipeline: Pipeline,
    epoch: int | None,
    scratch: str,
    restore_from: str = "auto",
    blocker: str | None = None,
) -> dict:
    """Where batch jobs that reproduce the run's state before `epoch` (None: at the end of
    its input) start. From the run's own state when it kept some (`restore` is then the
    batch spec's entry, with the run's stores copied under `scratch`): a retained checkpoint
    of an abs run, or a consistent cut of a nosync run's snapshots; else from the sources
    (`restore` None; `why_not` says why when the run's state was looked for).

    Also: `start`, what the state comes from, in words; `upto`, per worker, the checkpoint
    (abs) or snapshot seq (nosync: the id of its pre-commit) up to which the run's output files
    stand before the start; `steps`, per worker, the step of a nosync snapshot; `ops`, per
    worker, the operators' metadata there; `records`, what the sources had
    read; `input_logs`, the copy of a nosync run's input logs the jobs read its sources that
    cannot restart from (`_copy_input_logs`), or None. `blocker`: a reason of the caller's not
    to start from the run's state. Raises NosyncError when `restore_from` is "checkpoint" and
    there is none to start from."""
    point = _choose_start(run_dir, run, pipeline, epoch, scratch, restore_from, blocker)
    try:
        stores = (point.get("restore") or {}).get("state_dir")
        point["input_logs"] = _copy_input_logs(run_dir, run, pipeline, scratch, stores)
    except OSError as e:
        raise NosyncError(f"the input logs of {run_dir} cannot be copied: {e}") from None
    return point


def _choose_start(
    run_dir: str,
    run: dict,
    pipeline: Pipeline,
    epoch: int | None,
    scratch: str,
    restore_from: str,
    blocker: str | None,
) -> dict:
    _check_restore_from(restore_from)
    mode = run.get("mode")
    if restore_from == "checkpoint" and mode not in ("abs", "nosync"):
        raise NosyncError(
            f"--restore-from checkpoint: {run_dir} is a run in mode {mode}, which keeps no state to start from "
            "(modes abs and nosync do); use --restore-from sources"
        )
    none: dict = {"checkpoint": -1, "why_not": None, "restore": None, "start": "the sources"}
    if mode not in ("abs", "nosync") or restore_from == "sources":
        return none
    per_epoch = epoch_records_of(run)
    where = "at the end of the input" if epoch is None else f"at or before epoch {epoch}"
    point: dict = {}
    why_not = blocker
    made = not os.path.exists(scratch)

    def discard() -> None:
        """What this call put under `scratch`: all of it, if it made `scratch`."""
        shutil.rmtree(scratch if made else os.path.join(scratch, "state"), ignore_errors=True)

    if why_not is None:
        try:
            if mode == "abs":
                point = _checkpoint_before(run_dir, run, pipeline, epoch, per_epoch, where, scratch)
            else:
                copy = _copy_state(run_dir, run, scratch)
                if copy is None:
                    point = {"why_not": "the run kept no state"}
                else:
                    point = _snapshots_before(copy, int(run["workers"]), epoch, per_epoch, where, scratch)
        except (OSError, LsmError) as e:
            discard()
            # the copies' paths stand for the run's own stores
            said = str(e).replace(os.path.join(scratch, "state"), os.path.join(run_dir, "state"))
            raise NosyncError(f"the stores of {run_dir} cannot be read: {said}") from None
        why_not = point.get("why_not")
        if why_not is not None:
            discard()
    if why_not is not None:
        if restore_from == "checkpoint":
            what = "the end of the input" if epoch is None else f"epoch {epoch}"
            kept = "checkpoint" if mode == "abs" else "snapshot"
            raise NosyncError(f"{what} is outside the run's {kept} window: {why_not}")
        return {**none, "why_not": why_not}
    return {**none, **point}


def _checkpoint_before(
    run_dir: str, run: dict, pipeline: Pipeline, epoch: int | None, per_epoch: int, where: str, scratch: str
) -> dict:
    point = find_checkpoint_before(run_places(run_dir, run).shared, pipeline, epoch, per_epoch)
    c = point["checkpoint"]
    if c < 0:
        kept = point["retained"]
        return {
            "why_not": f"no retained checkpoint of the run lies {where}"
            + (f" (it retains checkpoints {kept[0]} to {kept[-1]})" if kept else " (it retains none)")
        }
    copy = _copy_state(run_dir, run, scratch)
    why_not = stores_hold(copy, c) if copy is not None else None
    if why_not is not None:
        return {"why_not": why_not}
    os.makedirs(scratch, exist_ok=True)
    chk = os.path.join(scratch, storage.name_of(point["path"]))
    with open(chk, "wb") as f:
        f.write(storage.read_bytes(point["path"]))
    body = point["body"]
    return {
        "checkpoint": c,
        "epoch": point["epoch"],
        "records": point["records"],
        "skipped": point["skipped"],
        "upto": dict.fromkeys(body["workers"], c),
        "steps": None,
        "ops": {w: v["ops"] for w, v in body["workers"].items()},
        "start": f"checkpoint {c} of the run, the latest retained {where}",
        "restore": {
            "kind": "abs",
            "checkpoint": c,
            "path": chk,
            "state_dir": os.path.join(scratch, "state"),
        },
    }


def _snapshots_before(copy: str, workers: int, epoch: int | None, per_epoch: int, where: str, scratch: str) -> dict:
    cut = find_snapshot_cut(copy, workers, epoch, per_epoch)
    if "why_not" in cut:
        return cut
    # the positions for every task; the frames in flight for the stage-0 task of their sender only
    path = codec.write_file(
        os.path.join(scratch, "cut.msgpack"), {"steps": cut["steps"], "seqs": cut["seqs"], "ops": cut["ops"]}
    )
    inflight = {
        w: codec.write_file(os.path.join(scratch, f"inflight-w{w}.msgpack"), rows)
        for w, rows in cut["inflight"].items()
    }
    steps = ", ".join(f"{s}" for _, s in sorted(cut["steps"].items()))
    flying = sum(1 for rows in cut["inflight"].values() for row in rows if row[3] < BUFFERED_SEQ)
    return {
        "epoch": cut["epoch"],
        "records": cut["records"],
        "skipped": [],
        "upto": cut["seqs"],
        "steps": cut["steps"],
        "ops": cut["ops"],
        "start": (
            f"the workers' own snapshots at steps {steps} (worker 0 on), the newest consistent cut {where}, "
            f"with {flying} frames in flight at it"
        ),
        "in_flight": flying,
        "restore": {"kind": "nosync", "cut": path, "inflight": inflight, "state_dir": copy},
    }


def rewind(
    run_dir: str,
    operator: str,
    to_epoch: int,
    pipeline_file: str | None = None,
    output: str | None = None,
    spark: Any = None,
    master: str | None = None,
    restore_from: str = "auto",
) -> dict:
    """Rewinds `operator` of the run in `run_dir` to just before epoch `to_epoch`; returns
    what it did. `restore_from`: "auto", "checkpoint" or "sources" (module docstring)."""

    _check_restore_from(restore_from)

    meta_path = os.path.join(run_dir, "run.json")
    if not os.path.isfile(meta_path):
        raise NosyncError(f"{run_dir} is not a run directory: it has no run.json")
    with open(meta_path, encoding="utf-8") as f:
        run = json.load(f)
    if run.get("epoch_ms"):
        raise NosyncError(
            f"the epochs of {run_dir} were cut by time (--epoch-ms {run['epoch_ms']}): their boundaries are not "
            "recorded, so it cannot be rewound to one"
        )
    params = dict(run.get("params") or {})
    old = load_pipeline(run["pipeline_file"], params)
    if to_epoch < 0:
        raise NosyncError(f"--to-epoch must be 0 or more, got {to_epoch}")
    edges = [(old.nodes[i].name, n.name) for n in old.nodes for i in n.inputs]
    try:
        cone = set(rewind_plan(edges, operator, to_epoch, {})["cone"])
    except ValueError:
        raise NosyncError(
            f"the run's pipeline '{old.name}' has no operator '{operator}'; operators: "
            f"{', '.join(n.name for n in old.nodes)}"
        ) from None
    node = next(n for n in old.nodes if n.name == operator)
    if node.kind == "source":
        raise NosyncError(f"'{operator}' is a source: it has no state to rewind; name an operator after it")
    output = os.path.abspath(output or f"{run_dir.rstrip(os.sep)}-rewind-{operator}-e{to_epoch}")
    if os.path.isdir(output) and os.listdir(output):
        raise NosyncError(f"--output {output} is not empty: a rewind writes a new output")
    new_file = os.path.abspath(pipeline_file or run["pipeline_file"])
    new_params = {**params, "output": output}
    new = load_pipeline(new_file, new_params)
    check_compatible(old, new, cone)
    cone_sinks = [(a, b) for a, b in zip(old.nodes, new.nodes, strict=True) if a.kind == "sink" and a.name in cone]
    last = max(
        (
            e
            for a, _ in cone_sinks
            for e in committed_epochs(getattr(a.params["sink"], "directory", ""))
            if e < (1 << 62)
        ),
        default=None,
    )
    if last is not None and to_epoch > last:
        raise NosyncError(f"epoch {to_epoch} is outside the run: its last committed epoch is {last}")
    olds = {getattr(a.params["sink"], "directory", None) for a in old.nodes if a.kind == "sink"} - {None}
    for _, b in cone_sinks:
        d = getattr(b.params["sink"], "directory", None)
        if d is not None and os.path.abspath(d) in {os.path.abspath(x) for x in olds}:
            raise PipelineError(
                f"sink '{b.name}' of the new pipeline writes to {d}, an output of the run: a rewind writes a new "
                "output (take the sink's directory from the parameter `output`)",
                b.name,
                b.where,
            )
    scratch = os.path.join(output, "_rewind")
    made = not os.path.exists(output)
    t0 = time.time()
    job = {"operator": operator, "new_file": new_file, "new_params": new_params, "cone": cone, "to_epoch": to_epoch}
    try:
        return _rewind(run_dir, run, old, new, job, output, scratch, restore_from, spark, master, t0)
    except BaseException:
        # the output was new or empty: nothing half-written stays to refuse a retry
        shutil.rmtree(output, ignore_errors=True)
        if not made:
            os.makedirs(output, exist_ok=True)
        raise
    finally:
        for copy in ("state", "inputs"):
            shutil.rmtree(os.path.join(scratch, copy), ignore_errors=True)


def _rewind(
    run_dir: str,
    run: dict,
    old: Pipeline,
    new: Pipeline,
    job: dict,
    output: str,
    scratch: str,
    restore_from: str,
    spark: Any,
    master: str | None,
    t0: float,
) -> dict:
    """The rewind once its input is checked (`job`: the operator, the new pipeline's file and
    parameters, the cone and the epoch)."""

    mode = run.get("mode")
    cone, to_epoch = job["cone"], job["to_epoch"]
    point = choose_start(run_dir, run, old, to_epoch, scratch, restore_from, _carry_blocker(old, new, cone))
    why_not = point["why_not"]
    os.makedirs(output, exist_ok=True)
    extra: dict = {
        "rewind": {
            "cone": [n.id for n in old.nodes if n.name in cone],
            "epoch": to_epoch,
            "pipeline_file": run["pipeline_file"],
            "pipeline_source": pipeline_source(run["pipeline_file"]),
            "params": dict(run.get("params") or {}),
        }
    }
    carried = carried_records = 0
    if point["restore"] is not None:
        extra["restore"] = point["restore"]
        upto = {int(w): int(c) for w, c in point["upto"].items()}
        carried = _carry_output(old, new, cone, upto, point["ops"])
        # per Files sink of the cone: what it had committed at the cut, and its pre-commits
        # up to it, which the run committed later
        carried_records = sum(
            int(meta["committed"]) + sum(int(h["records"]) for cc, h in meta["precommitted"] if cc <= upto[int(w)])
            for w, ops in point["ops"].items()
            for name, meta in ops.items()
            if name in cone and isinstance(old.node(name).params.get("sink"), sinks.Files)
        )
        restored = (
            f"{point['start']} (it lies in epoch {point['epoch']}, after {point['records']:,} records read); the "
            f"new output starts with the run's output up to it ({carried} files)"
            + "".join(f"; skipped {e}" for e in point["skipped"])
        )
    elif restore_from == "auto" and why_not is not None:
        restored = f"recomputed from the sources by batch jobs: {why_not}"
    elif point["input_logs"] is None:
        restored = "recomputed from the sources by batch jobs (no checkpoint or log of the run is read)"
    else:
        restored = "recomputed from the sources by batch jobs"
    if point["input_logs"] is not None:
        extra["input_logs"] = point["input_logs"]
        restored += "; the sources that cannot restart read back from the run's input logs"
    r, _ = run_jobs(
        job["new_file"],
        job["new_params"],
        int(run["workers"]),
        spark,
        master,
        run.get("epoch_records"),
        int(run.get("batch_size") or 1024),
        scratch,
        extra,
    )
    out = {
        "run_dir": os.path.abspath(run_dir),
        "mode": mode,
        "operator": job["operator"],
        "to_epoch": to_epoch,
        "cone": sorted(cone),
        "pipeline_file": job["new_file"],
        "changed": job["new_file"] != os.path.abspath(run["pipeline_file"]),
        "output": output,
        "restored": restored,
        "checkpoint": point["checkpoint"] if point["checkpoint"] >= 0 else None,
        "snapshots": point.get("steps") if point["restore"] is not None and point["checkpoint"] < 0 else None,
        "frames_in_flight": point.get("in_flight"),
        "start": "sources"
        if point["restore"] is None
        else {"abs": "checkpoint", "nosync": "snapshots"}[point["restore"]["kind"]],
        "by_epoch": mode == "replay",
        "records_read": r["read"] - (point["records"] if point["restore"] is not None else 0),
        "records_committed": carried_records + r["committed"],
        "records_carried": carried_records,
        "seconds": time.time() - t0,
    }
    with open(os.path.join(scratch, "rewind.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return out

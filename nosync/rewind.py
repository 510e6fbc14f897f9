"""Rewind: re-execute an operator and its downstream cone from a past epoch, with the same
or a changed pipeline, into a separate output.

The cone of operator X is X and every operator downstream of it (`lineage.rewind_plan`).
The rewind restores the cone to the state just before epoch E and re-executes epochs E on,
as Spark batch jobs (`nosync/batch.py`) that read the sources from the start: the original
pipeline's instances run up to the end of epoch E - 1, then, in the cone, the new
pipeline's instances take over their state, frontiers and watermarks and run on. Operators
outside the cone run the original code throughout. Only the cone's sinks write, every
epoch, into the new output: a whole output of one execution, which `nosync diff` compares
with the run's.

What "epoch" means for an output. The batch jobs process epochs in order, so what they emit
for epoch e is what epoch e's input caused. A run in mode replay aligns epochs the same way,
so the rewound output of a replay run equals the run's, epoch by epoch, before E (and after,
with the same pipeline). The other modes let an instance run ahead on one input: it emits
with the greatest epoch it has seen, so some of the run's records sit one epoch later than in
the rewound output; the outputs are then equal as wholes, not epoch by epoch.

The state before E is recomputed from the sources, whatever the run's mode: every epoch the
sources can read again can be rewound to, under abs, nosync, replay and none alike; nothing
is read from the run's checkpoints or logs, and nothing in the run directory is changed.

The new pipeline must be the same graph (names, kinds, inputs) as the original; outside the
cone its functions must be the original's too. A sink takes its directory from the
parameter `output`, which the rewind sets to the new output.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from lineage import rewind_plan
from nosync.errors import NosyncError, PipelineError
from nosync.loader import load_pipeline
from nosync.pipeline import Pipeline

FUNCTION_PARAMS = ("fn", "add", "init", "keep", "time", "key")
_PART = re.compile(r"^part-(\d+)-w\d+")


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


def _committed_epochs(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted({int(m.group(1)) for n in os.listdir(directory) if (m := _PART.match(n))})


def rewind(
    run_dir: str,
    operator: str,
    to_epoch: int,
    pipeline_file: str | None = None,
    output: str | None = None,
    spark: Any = None,
    master: str | None = None,
) -> dict:
    """Rewinds `operator` of the run in `run_dir` to just before epoch `to_epoch`; returns
    what it did."""
    from nosync.batch import _run

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
            for e in _committed_epochs(getattr(a.params["sink"], "directory", ""))
            if e < (1 << 62)
        ),
        default=None,
    )
    if last is not None and to_epoch > last:
        raise NosyncError(f"epoch {to_epoch} is outside the run: its last committed epoch is {last}")
    os.makedirs(output, exist_ok=True)
    t0 = time.time()
    extra = {
        "rewind": {
            "cone": [n.id for n in old.nodes if n.name in cone],
            "epoch": to_epoch,
            "pipeline_file": run["pipeline_file"],
            "params": params,
        }
    }
    r, _ = _run(
        new_file,
        new_params,
        int(run["workers"]),
        spark,
        master,
        run.get("epoch_records"),
        int(run.get("batch_size") or 1024),
        os.path.join(output, "_rewind"),
        extra,
    )
    out = {
        "run_dir": os.path.abspath(run_dir),
        "mode": run.get("mode"),
        "operator": operator,
        "to_epoch": to_epoch,
        "cone": sorted(cone),
        "pipeline_file": new_file,
        "changed": new_file != os.path.abspath(run["pipeline_file"]),
        "output": output,
        "restored": "recomputed from the sources by batch jobs (no checkpoint or log of the run is read)",
        "by_epoch": run.get("mode") == "replay",
        "records_read": r["read"],
        "records_committed": r["committed"],
        "seconds": time.time() - t0,
    }
    with open(os.path.join(output, "_rewind", "rewind.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return out

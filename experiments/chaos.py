"""`nosync chaos`: the judge of exactly-once.

A pipeline runs twice without failures (the reference, and a second run that proves the
pipeline deterministic) and once with K seeded SIGKILLs of worker processes at random moments
after the first completed checkpoint (or safe point). A recovery changes how the inputs of an
operator interleave: a worker stalls while the others go on, a restarted one reads its
sources in another rhythm. So the second failure-free run changes them too: it reads its
sources in chunks of another size (`other_batch_size`: two sources of a union then alternate
otherwise) and stops a worker K times for a while (SIGSTOP, then SIGCONT, at moments drawn as
the kills' are). A pipeline whose output depends on that interleaving (a stateful function
over one key's records from two sources or two workers, in whatever order they arrive)
differs then, and is reported as not deterministic instead of being judged on records that
its own timing changed.

Each run is a real `nosync run` in its own process, with its own run directory under `--out`
(`reference/`, `reference-2/`, `chaos/`) and its sinks writing to `<run dir>/output` (the
command sets `-p output=...`: pipeline files take their sink directories from
`args["output"]`, as the shipped workloads do).

The committed output of every sink is compared: file sinks as multisets of records (a record
is its JSON text with sorted keys), upsert sinks as final key-to-value maps. The records a
run's sources could not parse are compared too, when either run has any: the dead-letter
files of its workers, as a multiset of (source, file, position), under the name
`(dead letters)`; a line left torn counts as a record of its own. `lost` counts
records (or keys) of the reference missing from the chaos run, or with another value;
`duplicated` counts records (or keys) of the chaos run beyond the reference. If the two
reference runs differ, the pipeline is reported as not deterministic and nothing is judged.
A run with kills that fails (or does not end within the timeout) is not exactly-once: the
result has `run_failed`, the run's error, and nothing is compared. A run with kills in which
nothing recovered (it ended before its first kill, or the kills hit workers whose work was
done) is not judged (`no_recovery`): its output equals the reference's, or not, without
anything having recovered.

Kills: the victim and the moment are drawn from `random.Random(seed)`, measured in the run's
own progress so that they fall inside it however fast it goes: each kill waits until the run
is running (again, after the previous recovery), lets it advance by a random number of
progress units (checkpoint numbers, or epochs of the safe point or of the epoch committed
everywhere), within the kills' share of those the reference runs advanced by, then a random
delay within half the time between two progress events. Units, not events: after a recovery
in mode nosync the safe point waits for the recovered worker, then jumps several epochs in
one event, so a count of events would fall behind the run and leave kills out. The victim's pid
comes from the coordinator's events (`events.jsonl`: the newest registration of that worker).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

from nosync.errors import NosyncError, RunFailed
from nosync.runtime.dead_letters import dead_letter_record

PAUSE_S = (0.3, 1.5)
"""How long a pause of the second failure-free run stops a worker, drawn uniformly: about as
long as a recovery stalls one (the coordinator takes a worker silent for 30 s as lost)."""
DEFAULT_BATCH_SIZE = 1024
"""`nosync run`'s default --batch-size."""
PROGRESS_EVENTS = ("checkpoint_completed", "safe_point", "committed")
"""Events after which a kill can find something to recover from."""
DEAD_LETTERS = "(dead letters)"
"""The name the records a run's sources could not parse are compared under, as a sink's."""
ENDED = 1 << 62
"""A progress value at or above it is the end of the input (the epoch of a finished channel)."""


def progress_value(event: dict) -> int:
    """How far a progress event says the run has got: its checkpoint number, or its epoch."""
    return int(event["checkpoint"] if event["event"] == "checkpoint_completed" else event["epoch"])


def advanced(events: list[dict], start: int) -> int:
    """Progress units the run advanced by from `events[start]` on: from the last progress
    value before it, or, with none before it, counting the first one after it as one."""
    before = [progress_value(e) for e in events[:start] if e["event"] in PROGRESS_EVENTS]
    after = [progress_value(e) for e in events[start:] if e["event"] in PROGRESS_EVENTS]
    if not after:
        return 0
    base = before[-1] if before else min(after) - 1
    return max(after) - base


def other_batch_size(batch_size: int | None) -> int:
    """The chunk size the second failure-free run reads its sources in: two thirds of the
    first's, which shifts where the chunks of two sources fall against each other."""
    return max(1, (batch_size or DEFAULT_BATCH_SIZE) * 2 // 3)


def canonical(record: Any) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=repr)


def committed_outputs(pipeline_file: str, params: dict) -> dict[str, tuple[str, Any]]:
    """Per sink name: ("multiset", Counter of records) or ("map", {key: value}), or
    ("unjudged", None) for sinks that keep nothing (Null, Console)."""
    from nosync.api import sinks
    from nosync.api.loader import load_pipeline

    p = load_pipeline(pipeline_file, params)
    out: dict[str, tuple[str, Any]] = {}
    for node in p.sinks:
        sink = node.params["sink"]
        if isinstance(sink, sinks.Files):
            out[node.name] = ("multiset", collections.Counter(canonical(r) for r in sink.read_committed()))
        elif isinstance(sink, sinks.LevelDB):
            out[node.name] = ("map", {canonical(k): canonical(v) for k, v in sink.read_committed().items()})
        else:
            out[node.name] = ("unjudged", None)
    return out


def dead_letters(run_dir: str) -> collections.Counter:
    """The records a run's sources could not parse, from its workers' dead-letter files: a
    multiset of (source, file, position), each as its canonical JSON text."""
    found: collections.Counter = collections.Counter()
    for path in sorted(glob.glob(os.path.join(run_dir, "dead-letter-w*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                d = dead_letter_record(line)
                if d is None:
                    found[canonical(["a torn line", os.path.basename(path), line])] += 1
                else:
                    found[canonical([d["source"], d["file"], d["position"]])] += 1
    return found


def compare(ref: dict, got: dict) -> dict:
    """Lost and duplicated records of every sink of `got` against `ref`."""
    per_sink = {}
    for name, (kind, want) in ref.items():
        have = got.get(name, (kind, None))[1]
        if kind == "multiset":
            have = have or collections.Counter()
            lost = sum((want - have).values())
            dup = sum((have - want).values())
            per_sink[name] = {"kind": "files", "records": sum(want.values()), "lost": lost, "duplicated": dup}
        elif kind == "map":
            have = have or {}
            missing = sum(1 for k in want if k not in have)
            wrong = sum(1 for k, v in want.items() if k in have and have[k] != v)
            extra = sum(1 for k in have if k not in want)
            per_sink[name] = {
                "kind": "upsert",
                "keys": len(want),
                "lost": missing + wrong,
                "wrong_values": wrong,
                "duplicated": extra,
            }
        else:
            per_sink[name] = {"kind": "not judged (keeps no output)"}
    dead = per_sink.get(DEAD_LETTERS)
    if dead is not None and not dead["records"] and not dead["duplicated"]:
        del per_sink[DEAD_LETTERS]  # no run could not parse anything: nothing to show
    return per_sink


class Events:
    """Follows a run's events.jsonl as it grows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.seen: list[dict] = []

    def poll(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind("\n")
        if end < 0:
            return []
        self.pos += len(data[: end + 1].encode("utf-8"))
        new = [json.loads(line) for line in data[: end + 1].splitlines() if line.strip()]
        self.seen.extend(new)
        return new

    def pid_of(self, worker: int) -> int | None:
        regs = [e for e in self.seen if e["event"] == "registered" and e["worker"] == worker]
        return regs[-1]["pid"] if regs else None


def _run_cmd(pipeline_file: str, run_dir: str, mode: str, workers: int, params: dict, options: dict) -> list[str]:
    cmd = [sys.executable, "-m", "cli.main", "run", pipeline_file, "--mode", mode, "--workers", str(workers)]
    cmd += ["--run-dir", run_dir]
    for k, v in options.items():
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    for k, v in {**params, "output": os.path.join(run_dir, "output")}.items():
        cmd += ["-p", f"{k}={v}"]
    return cmd


def _start(cmd: list[str], log_path: str) -> subprocess.Popen:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by _finish
    proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc._nosync_log = log  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, run_dir: str, timeout: float) -> dict:
    late = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        late = True
        proc.kill()
        proc.wait()
    proc._nosync_log.close()  # type: ignore[attr-defined]
    summary_path = os.path.join(run_dir, "summary.json")
    if proc.returncode != 0 or not os.path.exists(summary_path):
        with open(os.path.join(run_dir + ".log"), encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        # the CLI's own error line when it wrote one, else the end of the log (a stack trace)
        said = [
            line.removeprefix("error: ").removeprefix("run failed: ") for line in lines if line.startswith("error: ")
        ]
        why = " | ".join(said[-1:] or lines[-5:])
        if not late and proc.returncode == 2:
            raise NosyncError(f"the run in {run_dir} refused its command line: {why}")  # a usage error
        how = "had not ended at the timeout, and was stopped" if late else f"failed (exit {proc.returncode})"
        raise RunFailed(f"the run in {run_dir} {how}: {why}")
    with open(summary_path, encoding="utf-8") as f:
        return json.load(f)


def run_reference(
    pipeline_file: str, run_dir: str, mode: str, workers: int, params: dict, options: dict, timeout: float
) -> dict:
    proc = _start(_run_cmd(pipeline_file, run_dir, mode, workers, params, options), run_dir + ".log")
    return _finish(proc, run_dir, timeout)


def run_chaos(
    pipeline_file: str,
    run_dir: str,
    mode: str,
    workers: int,
    params: dict,
    options: dict,
    kills: int,
    rng: random.Random,
    plan: dict,
    timeout: float,
    progress: Any,
    pause: bool = False,
) -> tuple[dict, list]:
    """The run with kills; returns its summary ({"failed": why} for a run that failed or did
    not end in time) and, per kill, its time, victim, pid and the seconds until the run was
    running again (`recovery_s`).
    `pause`: stop the victim for a while (`PAUSE_S`) instead of killing it.

    `plan` comes from the reference runs: `skip`, how many progress units (checkpoint
    numbers, epochs) a kill may let the run advance by before it, and `gap_s`, the time
    between two progress events. Each kill waits for the run to be running (again), lets it
    advance by more than 0..skip units, then a random delay within half a gap: a random
    moment that the run still has ahead of it even when this run is faster than the
    references were. A pause counts from the previous pause."""
    proc = _start(_run_cmd(pipeline_file, run_dir, mode, workers, params, options), run_dir + ".log")
    events = Events(os.path.join(run_dir, "events.jsonl"))
    done: list[dict] = []
    deadline = time.monotonic() + timeout

    def ended() -> bool:
        return (
            proc.poll() is not None
            or time.monotonic() > deadline
            or any(e["event"] in ("finished", "failed") for e in events.seen)
        )

    try:
        while len(done) < kills and not ended():
            skip = rng.randint(0, plan["skip"])
            delay = rng.uniform(0, plan["gap_s"] / 2)
            victim = rng.randrange(workers)
            # the first progress event after the run was last (re)started, then `skip` more
            start = max((i for i, e in enumerate(events.seen) if e["event"] == "running"), default=None)
            if pause and done:
                start = max(start or 0, done[-1]["seen"])
            while not ended():
                events.poll()
                if start is None:
                    start = next((i for i, e in enumerate(events.seen) if e["event"] == "running"), None)
                if start is not None and advanced(events.seen, start) > skip:
                    break
                time.sleep(0.01)
            time.sleep(delay)
            events.poll()
            pid = events.pid_of(victim)
            if ended() or pid is None:
                break
            if pause:
                stop_s = rng.uniform(*PAUSE_S)
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                try:
                    time.sleep(stop_s)
                finally:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                events.poll()
                pause_ = {"t": time.time(), "worker": victim, "pid": pid, "pause_s": stop_s, "seen": len(events.seen)}
                done.append(pause_)
                progress(f"paused worker {victim} (pid {pid}) for {stop_s:.2f} s")
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kill = {"t": time.time(), "worker": victim, "pid": pid}
            done.append(kill)
            progress(f"killed worker {victim} (pid {pid})")
            # the next kill waits for the run to be running again after this one: every worker
            # (a regroup), or the lost one alone (a worker that recovered by itself)
            while not ended():
                events.poll()
                regroups = [i for i, e in enumerate(events.seen) if e["event"] == "regroup" and e["t"] >= kill["t"] - 1]
                if regroups and any(e["event"] == "running" for e in events.seen[regroups[-1] :]):
                    break
                if any(e["event"] == "recovered" and e["t"] >= kill["t"] for e in events.seen):
                    break
                time.sleep(0.01)
        try:
            summary = _finish(proc, run_dir, max(1.0, deadline - time.monotonic()))
        except RunFailed as e:
            summary = {"failed": str(e)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events.poll()
    if not pause:
        for k in done:
            back = [e["t"] for e in events.seen if e["event"] in ("running", "recovered") and e["t"] > k["t"]]
            k["recovery_s"] = (back[0] - k["t"]) if back else None
    return summary, done


def kill_plan(reference_dirs: list[str], kills: int) -> dict:
    """How far into a run kills may go, from the failure-free runs: the fewest progress units
    a reference run advanced by before it finished, less the last two (the checkpoints that
    come with the end of the input), shared among the kills with a margin for a run that
    checkpoints less often; and the median time between two progress events."""
    counts, gaps = [], []
    for d in reference_dirs:
        ev = Events(os.path.join(d, "events.jsonl"))
        ev.poll()
        end = next((e["t"] for e in ev.seen if e["event"] == "finished"), float("inf"))
        seen = [e for e in ev.seen if e["event"] in PROGRESS_EVENTS and e["t"] < end]
        values = [v for v in map(progress_value, seen) if v < ENDED]
        counts.append(max(values) - min(values) + 1 if values else 0)
        ts = [e["t"] for e in seen]
        gaps += [b - a for a, b in zip(ts, ts[1:], strict=False)]
    gaps.sort()
    return {
        "skip": max(0, (min(counts, default=0) - 2) // (kills + 1) - 1),
        "gap_s": gaps[len(gaps) // 2] if gaps else 0.2,
    }


def chaos(
    pipeline_file: str,
    mode: str,
    workers: int,
    kills: int,
    seed: int,
    params: dict,
    out: str,
    options: dict | None = None,
    timeout: float = 600.0,
    progress: Any = lambda msg: None,
) -> dict:
    if mode == "none":
        raise NosyncError("mode none does not recover: a kill fails the run. chaos judges abs, nosync and replay")
    if kills < 1:
        raise NosyncError(f"--kills must be at least 1, got {kills}")
    pipeline_file = os.path.abspath(pipeline_file)
    out = os.path.abspath(out)
    if os.path.exists(out) and os.listdir(out):
        raise NosyncError(f"--out {out} is not empty: chaos keeps its runs there, give an empty or new directory")
    os.makedirs(out, exist_ok=True)
    options = dict(options or {})
    dirs = {name: os.path.join(out, name) for name in ("reference", "reference-2", "chaos")}

    def outputs(run_dir: str) -> dict:
        got = committed_outputs(pipeline_file, {**params, "output": os.path.join(run_dir, "output")})
        got[DEAD_LETTERS] = ("multiset", dead_letters(run_dir))
        return got

    progress("reference run")
    run_reference(pipeline_file, dirs["reference"], mode, workers, params, options, timeout)
    second = {**options, "batch_size": other_batch_size(options.get("batch_size"))}
    progress(
        f"second reference run (determinism): chunks of {second['batch_size']} records, {kills} pause(s) of a worker"
    )
    summary, paused = run_chaos(
        pipeline_file,
        dirs["reference-2"],
        mode,
        workers,
        params,
        second,
        kills,
        random.Random(f"pauses-{seed}"),
        kill_plan([dirs["reference"]], kills),
        timeout,
        progress,
        pause=True,
    )
    if "failed" in summary:
        raise RunFailed(summary["failed"])
    ref = outputs(dirs["reference"])
    again = compare(ref, outputs(dirs["reference-2"]))
    result: dict[str, Any] = {
        "pipeline": pipeline_file,
        "mode": mode,
        "workers": workers,
        "seed": seed,
        "kills_requested": kills,
        "reference": dirs["reference"],
        "chaos": dirs["chaos"],
        "reference_2": {
            "batch_size": second["batch_size"],
            "paused": [{"worker": p["worker"], "pause_s": round(p["pause_s"], 3)} for p in paused],
        },
    }
    if any(s.get("lost") or s.get("duplicated") for s in again.values()):
        result.update(deterministic=False, exactly_once=None, judged=False, reference_diff=again)
        return result
    rng = random.Random(seed)
    plan = kill_plan([dirs["reference"], dirs["reference-2"]], kills)
    progress(f"chaos run: {kills} kill(s), seed {seed}")
    summary, done = run_chaos(
        pipeline_file, dirs["chaos"], mode, workers, params, options, kills, rng, plan, timeout, progress
    )
    result.update(
        deterministic=True,
        kills=len(done),
        recovery_s=[k["recovery_s"] for k in done],
        killed=[{"worker": k["worker"], "pid": k["pid"]} for k in done],
    )
    if "failed" in summary:
        # a recovery that could not complete: nothing committed to compare, and not exactly-once
        result.update(judged=False, exactly_once=False, run_failed=summary["failed"])
        return result
    per_sink = compare(ref, outputs(dirs["chaos"]))
    lost = sum(s.get("lost", 0) for s in per_sink.values())
    dup = sum(s.get("duplicated", 0) for s in per_sink.values())
    judged = any("lost" in s for s in per_sink.values())
    result.update(
        judged=judged,
        exactly_once=judged and lost == 0 and dup == 0,
        lost=lost,
        duplicated=dup,
        recoveries=len(summary.get("recoveries") or []),
        records_reprocessed=[r.get("records_reprocessed") for r in summary.get("recoveries") or []],
        sinks=per_sink,
    )
    if not result["recoveries"]:
        # no kill was made, or none hit a worker before its work was done: nothing recovered,
        # and equal outputs say nothing about a recovery
        result.update(judged=False, exactly_once=None, no_recovery=True)
    return result


def exit_code(result: dict) -> int:
    """`nosync chaos`'s exit code for a result of `chaos`: 0 exactly-once; 1 records lost or
    duplicated, or the run with kills failed; 3 not deterministic; 4 nothing recovered in the
    run with kills (no kill before it ended, or only of workers already done: nothing judged)."""
    if not result["deterministic"]:
        return 3
    if result.get("no_recovery"):
        return 4
    return 0 if result["exactly_once"] else 1

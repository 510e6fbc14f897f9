"""`nosync chaos`: the judge of exactly-once.

A pipeline runs twice without failures (the reference, and a second run that proves the
pipeline deterministic) and once with K seeded SIGKILLs of worker processes at random moments
spread over the run (below). A recovery changes how the inputs of an
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
result has `run_failed`, the run's error, and nothing is compared. A run with kills that
ended before every kill asked for was made is not judged (`kills_short`; `kills` of
`kills_requested`), unless a recovery lost or duplicated records anyway; nor is one in which
nothing recovered (every kill hit a worker whose work was done, `no_recovery`): its output
equals the reference's, or not, without anything having recovered.

Kills: each is placed by the run's own progress in records read, so that it falls inside the
run however fast it goes. The coordinator writes the records its workers have read, summed,
to `events.jsonl` (`progress`, every 0.2 s at most); the most any of them showed is how far
the run has got (a restored worker counts again from its restored position: the sum drops,
its maximum does not). The reference runs read R records (their summaries); kill k of K comes
at a number of records read drawn from `random.Random(seed)` inside the k-th of K equal
slices of [10%, 80%] of R (`kill_targets`), once the run is running with something to recover
from (its first completed checkpoint, safe point or committed epoch; under mode nosync, whose
workers snapshot alone, a durable snapshot of each victim's own) and the previous kill's
recovery completed (a `running` after a `regroup`, or the victim's `recovered`); a target
passed by then is a kill at once. The victim is drawn from the same rng; its pid comes from
the coordinator's events (the newest registration of that worker). The second reference run's
pauses are placed the same way, from an rng of their own.
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

from experiments.failures import (
    MACHINES_LOST,
    OF_HOSTS,
    PAUSE_SHARE,
    SILENT,
    lose_machines,
    refusal,
    wiped_before_retry,
)
from nosync import storage
from nosync.errors import NosyncError, RunFailed
from nosync.options import FAILURE_TIMEOUT_MS
from nosync.places import shared_of
from nosync.runtime.dead_letters import dead_letter_record

PAUSE_S = (0.3, 1.5)
"""How long a pause of the second failure-free run stops a worker, drawn uniformly: about as
long as a recovery stalls one, and never beyond `PAUSE_TIMEOUT_SHARE` of the failure timeout
(a pause the coordinator would take for a failure)."""
PAUSE_TIMEOUT_SHARE = 0.6
DEFAULT_BATCH_SIZE = 1024
"""`nosync run`'s default --batch-size."""
PROGRESS_EVENTS = ("checkpoint_completed", "safe_point", "committed")
"""Events after which a kill can find something to recover from."""
DEAD_LETTERS = "(dead letters)"
"""The name the records a run's sources could not parse are compared under, as a sink's."""
KILL_FIELDS = (
    "workers",
    "pids",
    "hosts",
    "read",
    "apart_ms",
    "wiped_before_retry",
    "detection_s",
    "back_to_90_s",
    "suspected",
    "pause_s",
    "resumed",
    "cut_s",
    "healed",
    "stopped_pids",
    "stopped",
)
"""What the result says of each failure made."""
KILL_SPAN = (0.1, 0.8)
"""The share of a run's records read that its kills fall in (`kill_targets`): none in its
first tenth, where there may be nothing to recover from yet, nor in its last fifth, where a
worker's work may be done."""


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


def restores_to(mode: str, e: dict, worker: int) -> bool:
    """Whether event `e` gives `worker` state a restore goes back to: under nosync a durable
    snapshot of its own (a safe point comes long before a worker's first), else any
    PROGRESS_EVENTS one (a completed checkpoint, ...)."""
    if mode == "nosync":
        return e["event"] == "snapshot" and e.get("worker") == worker
    return e["event"] in PROGRESS_EVENTS


class Progress(Events):
    """A run's events.jsonl followed for what a kill waits on: the records read so far, as the
    most any `progress` event showed (a restored worker counts again from its restored
    position, so the sum goes down after a recovery; its maximum does not), and whether the
    run is running with something to recover from (a `running` event and a PROGRESS_EVENTS one)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.read = 0
        self.running = False
        self.armed = False
        self.snapshotted: set[int] = set()
        """Workers with a durable snapshot of their own (`snapshot` events: mode nosync)."""
        self.over = False
        """Whether the run finished or failed."""

    def poll(self) -> list[dict]:
        new = super().poll()
        for e in new:
            kind = e["event"]
            if kind == "progress":
                self.read = max(self.read, int(e["read"]))
            elif kind == "running":
                self.running = True
            elif kind in PROGRESS_EVENTS:
                self.armed = True
            elif kind == "snapshot":
                self.snapshotted.add(int(e["worker"]))
            elif kind in ("finished", "failed"):
                self.over = True
        return new

    def restorable(self, mode: str, victims: list[int]) -> bool:
        """Whether a kill of `victims` now finds state to restore: the run made progress (a
        PROGRESS_EVENTS one) and each victim saw an event `restores_to` names (under nosync a
        durable snapshot of its own: a kill before it re-executes the victim from the start)."""
        return self.armed and (mode != "nosync" or self.snapshotted.issuperset(victims))


def _suspected(seen: list[dict], since: int, victims: list[int], until: float | None = None) -> bool:
    """Whether the coordinator suspected one of `victims` (events from `since` on, up to time
    `until`)."""
    return any(
        e["event"] == "suspected" and e.get("worker") in victims and (until is None or e["t"] <= until)
        for e in seen[since:]
    )


def _resume(pid: int) -> bool:
    """Resumes a stopped process (SIGCONT); False when it is gone (killed meanwhile)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


def _recovered(seen: list[dict], since: int, victims: list[int]) -> bool:
    """Whether the run is running again after losing `victims` (events from `since` on):
    every worker after a regroup, or each victim alone (a worker that recovered by itself)."""
    after = seen[since:]
    regroups = [i for i, e in enumerate(after) if e["event"] == "regroup"]
    if regroups and any(e["event"] == "running" for e in after[regroups[-1] :]):
        return True
    back = {e.get("worker") for e in after if e["event"] == "recovered"}
    return all(v in back for v in victims)


def run_output(run_dir: str, options: dict) -> str:
    """Where a run's sinks write (its `-p output=`): `<run dir>/output`, or, given a shared tier
    (`--remote`: a run on a cluster), the run's own folder there, which every host reaches."""
    remote = options.get("remote")
    if remote:
        return storage.join(shared_of(os.path.abspath(run_dir), remote), "output")
    return os.path.join(run_dir, "output")


def _run_cmd(pipeline_file: str, run_dir: str, mode: str, workers: int, params: dict, options: dict) -> list[str]:
    cmd = [sys.executable, "-m", "cli.main", "run", pipeline_file, "--mode", mode, "--workers", str(workers)]
    cmd += ["--run-dir", run_dir]
    for k, v in options.items():
        if v is not None:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    for k, v in {**params, "output": run_output(run_dir, options)}.items():
        cmd += ["-p", f"{k}={v}"]
    return cmd


def _start(cmd: list[str], log_path: str, append: bool = False) -> subprocess.Popen:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(log_path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - closed by _finish
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
    targets: list[int],
    rng: random.Random,
    timeout: float,
    progress: Any,
    pause: bool = False,
    failure: str = "process",
    cluster: Any = None,
) -> tuple[dict, list]:
    """The run with kills; returns its summary ({"failed": why} for a run that failed or did
    not end in time) and, per kill made, its time, victims, pids, the records read then and the
    seconds until the run was running again (`recovery_s`); for a class that loses machines,
    the time the victims' disks were wiped and whether that came before each retry
    registered (`wiped_before_retry`, per victim).
    `pause`: stop one victim for a while (`PAUSE_S`) instead of killing it (the second
    failure-free run). Failure classes `hang` and `pause` stop the victim too, never to resume
    it or for a time drawn around the failure timeout (`PAUSE_SHARE`); each such failure
    reports whether the coordinator suspected it (`suspected`), and a pause whether the process
    was still there to resume (`resumed`).
    `failure`: the class of each kill (`experiments.failures`): its victims' processes killed
    (two distinct workers for `two`, the second right after the first), then, for `machine`
    and `two`, their local disks wiped. On a `cluster` (`experiments.cluster`), a lost machine
    is the victim's host: every process of it killed (its Spark worker and executor too), its
    private disk gone with them, then a new machine in its place (an empty disk).

    `targets` (`kill_targets`): kill k comes once the run has read `targets[k]` records (the
    most a `progress` event showed), the run is running and has something to recover from
    (its first checkpoint, safe point or committed epoch; under nosync, each victim's own
    durable snapshot), and the previous kill's recovery completed; a target passed by then is
    a kill at once. A run that ends first leaves the kills after it unmade: fewer are returned
    than asked for. The victims and the pauses' lengths are drawn from `rng`."""
    cmd = _run_cmd(pipeline_file, run_dir, mode, workers, params, options)
    proc = _start(cmd, run_dir + ".log")
    events = Progress(os.path.join(run_dir, "events.jsonl"))
    done: list[dict] = []
    deadline = time.monotonic() + timeout
    lost = 1 if pause else max(1, MACHINES_LOST[failure])
    timeout_s = (options.get("failure_timeout_ms") or FAILURE_TIMEOUT_MS) / 1000
    silent = failure in SILENT and not pause
    of_host = failure in OF_HOSTS and not pause
    quiet = silent or of_host
    stopped: list[int] = []
    cut: list[Any] = []
    hung: list[Any] = []

    def ended() -> bool:
        return proc.poll() is not None or time.monotonic() > deadline or events.over

    try:
        for target in targets:
            victims = rng.sample(range(workers), lost)
            stop_s = 0.0
            if pause:
                stop_s = rng.uniform(PAUSE_S[0], min(PAUSE_S[1], PAUSE_TIMEOUT_SHARE * timeout_s))
            elif failure in ("pause", "partition"):
                stop_s = rng.uniform(*PAUSE_SHARE) * timeout_s
            kill: dict | None = None
            if failure == "stop" and not pause:
                proc, events, kill = _stop_and_resume(proc, events, cmd, run_dir, target, ended, deadline)
                if kill is None:
                    break
                done.append(kill)
                progress(
                    f"stopped the run (SIGTERM) at {kill['read']:,} records read, at epoch "
                    f"{kill['stopped']['epoch']}, in {kill['stopped']['stop_s']} s; resumed it"
                )
                continue
            while kill is None and not ended():
                events.poll()
                pids = [events.pid_of(v) for v in victims]
                if not (
                    events.running and events.restorable(mode, victims) and events.read >= target and None not in pids
                ):
                    time.sleep(0.01)
                    continue
                seen, read = len(events.seen), events.read
                hosts = []
                if cluster is not None and MACHINES_LOST[failure] and not pause:
                    hosts = list(dict.fromkeys(cluster.host_of_pid(pid) for pid in pids))
                    if None in hosts:
                        time.sleep(0.01)  # a victim's process is gone already: its next one
                        continue
                if of_host:
                    host = cluster.host_of_pid(pids[0])
                    if host is None:
                        time.sleep(0.01)  # the victim's process is gone already: its next one
                        continue
                    hosts = [host]
                times = []
                if of_host:
                    if failure == "partition":
                        times.append(cluster.cut_host(hosts[0]))
                        cut.append(hosts[0])
                    else:
                        times.append(time.time())
                        hung.append(hosts[0])
                        stopped_pids = cluster.stop_host(hosts[0])
                elif hosts:
                    for h in hosts:
                        times.append(time.time())
                        wiped = cluster.kill_host(h)
                else:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGSTOP if pause or silent else signal.SIGKILL)
                        except ProcessLookupError:
                            continue  # gone already: lost all the same
                        times.append(time.time())
                        if silent:
                            stopped.append(pid)
                if not times:
                    # every victim's process was gone already: the kill waits for their next ones
                    time.sleep(0.01)
                    continue
                kill = {"t": times[0], "workers": victims, "pids": pids, "read": read, "seen": seen}
                if len(times) > 1:
                    kill["apart_ms"] = (times[-1] - times[0]) * 1000
                if of_host:
                    kill["hosts"] = [hosts[0].name]
                    if failure == "hang-machine":
                        kill["stopped_pids"] = len(stopped_pids)
                elif hosts:
                    kill["wiped"] = wiped
                    kill["hosts"] = [h.name for h in hosts]
                    for h in hosts:
                        cluster.restart_host(h)  # a new machine in its place, with an empty disk
                elif MACHINES_LOST[failure] and not pause:
                    kill["wiped"] = lose_machines(run_dir, victims)
            if kill is None:
                break
            done.append(kill)
            who = " and ".join(f"worker {v} (pid {p})" for v, p in zip(victims, kill["pids"], strict=True))
            if pause or failure == "pause":
                try:
                    time.sleep(stop_s)
                finally:
                    kill["resumed"] = _resume(kill["pids"][0])
                kill["pause_s"] = stop_s
                progress(f"paused {who} for {stop_s:.2f} s at {kill['read']:,} records read")
                if pause:
                    continue
                time.sleep(0.3)  # a suspicion at the end of the pause reaches events.jsonl
                events.poll()
                if not _suspected(events.seen, kill["seen"], victims, kill["t"] + stop_s + 0.25):
                    continue  # below the failure timeout: nothing to recover, nothing to wait for
            elif failure == "partition":
                try:
                    time.sleep(stop_s)
                finally:
                    cluster.heal_host(cut.pop())
                    kill["healed"] = True
                kill["cut_s"] = stop_s
                progress(f"cut {kill['hosts'][0]} (with {who}) off the network for {stop_s:.2f} s")
                time.sleep(0.3)  # a suspicion at the end of the cut reaches events.jsonl
                events.poll()
                if not _suspected(events.seen, kill["seen"], victims, kill["t"] + stop_s + 0.25):
                    continue  # below the failure timeout: nothing to recover, nothing to wait for
            elif failure == "hang-machine":
                progress(f"stopped every process of {kill['hosts'][0]} (with {who}) for good")
            elif failure == "hang":
                progress(f"stopped {who} for good at {kill['read']:,} records read (target {target:,})")
            if not quiet:
                how = "killed" if "wiped" not in kill else "lost the machine of"
                wiped = ""
                if "wiped" in kill:
                    wiped = f", disk wiped {(kill['wiped'] - kill['t']) * 1000:.0f} ms after the kill"
                progress(f"{how} {who} at {kill['read']:,} records read (target {target:,}){wiped}")
            # the next kill waits for the run to be running again after this one
            while not ended() and not _recovered(events.seen, kill["seen"], kill["workers"]):
                events.poll()
                time.sleep(0.01)
        try:
            summary = _finish(proc, run_dir, max(1.0, deadline - time.monotonic()))
        except RunFailed as e:
            summary = {"failed": str(e)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in stopped:
            # a hung process Spark did not kill (the run ended first, or failed): not left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for host in cut:
            cluster.heal_host(host)  # a cut the run's end interrupted
        for host in hung:
            # the stopped machine replaced by a new one, for the next run
            cluster.kill_host(host)
            cluster.restart_host(host)
    events.poll()
    if not pause:
        for i, k in enumerate(done):
            back = [e["t"] for e in events.seen if e["event"] in ("running", "recovered") and e["t"] > k["t"]]
            k["recovery_s"] = (back[0] - k["t"]) if back else None
            # what this failure caused: up to the next one, and for a pause only while the
            # process was stopped (a beat in flight at the resume allowed for)
            until = done[i + 1]["t"] if i + 1 < len(done) else None
            if "pause_s" in k or "cut_s" in k:
                until = k["t"] + k.get("pause_s", k.get("cut_s", 0.0)) + 0.25
            found = [
                e["t"]
                for e in events.seen[k["seen"] :]
                if e["event"] in ("suspected", "worker_lost")
                and e.get("worker") in k["workers"]
                and (until is None or e["t"] <= until)
            ]
            k["detection_s"] = (found[0] - k["t"]) if found else None
            if quiet:
                k["suspected"] = _suspected(events.seen, k["seen"], k["workers"], until)
            lost_at = [r for r in summary.get("recoveries") or [] if r.get("lost_at", 0) >= k["t"]]
            if lost_at and lost_at[0].get("back_to_90_s") is not None:
                k["back_to_90_s"] = lost_at[0]["lost_at"] + lost_at[0]["back_to_90_s"] - k["t"]
            if "wiped" in k:
                k["wiped_before_retry"] = [
                    wiped_before_retry(events.seen, k["seen"], v, p, k["wiped"])
                    for v, p in zip(k["workers"], k["pids"], strict=True)
                ]
    return summary, done


def _stop_and_resume(
    proc: subprocess.Popen, events: Any, cmd: list[str], run_dir: str, target: int, ended: Any, deadline: float
) -> tuple[subprocess.Popen, Any, dict | None]:
    """Stops the run cleanly (SIGTERM) once it is running and has read `target` records, checks
    that it exited 0 saying where it stopped, and starts it again with `--resume`: the process
    and the events to follow next, and what the stop was (None: the run ended first)."""
    while not ended():
        events.poll()
        if events.running and events.read >= target:
            break
        time.sleep(0.01)
    else:
        return proc, events, None
    read, t = events.read, time.time()
    proc.send_signal(signal.SIGTERM)
    summary = _finish(proc, run_dir, max(1.0, deadline - time.monotonic()))
    if not summary.get("stopped"):
        raise RunFailed(f"the run in {run_dir} ended on SIGTERM without saying it stopped (summary.json)")
    path = os.path.join(run_dir, "events.jsonl")
    again = Progress(path)
    again.pos = os.path.getsize(path)  # the resumed run's events only
    proc = _start([*cmd, "--resume"], run_dir + ".log", append=True)
    kill = {"t": t, "workers": [], "pids": [], "read": read, "seen": 0, "stopped": summary["stopped"]}
    return proc, again, kill


def reference_reads(run_dirs: list[str]) -> int:
    """The records the failure-free runs in `run_dirs` read, the fewest of them: from each
    run's summary.json, else the most its `progress` events showed."""
    counts = []
    for d in run_dirs:
        n = None
        path = os.path.join(d, "summary.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                n = json.load(f).get("records_read")
        if n is None:
            ev = Events(os.path.join(d, "events.jsonl"))
            ev.poll()
            n = max((e["read"] for e in ev.seen if e["event"] == "progress"), default=0)
        counts.append(int(n))
    return min(counts, default=0)


def kill_targets(total: int, kills: int, rng: random.Random) -> list[int]:
    """The records read at which each of `kills` kills comes, for a run that reads `total`:
    kill k (from 0) at a point drawn uniformly inside the k-th of `kills` equal slices of
    KILL_SPAN x total, so the kills are spread over the run, in order, and none comes in its
    first or last stretch."""
    lo, hi = KILL_SPAN
    width = (hi - lo) * total / kills
    return [int(lo * total + width * (k + rng.random())) for k in range(kills)]


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
    failure: str = "process",
    cluster: Any = None,
) -> dict:
    """Judges exactly-once of `pipeline_file` under `mode` at `workers` workers against `kills`
    failures of class `failure` (`experiments.failures`), drawn from `seed`; the runs go under
    `out`, with `options` passed to every `nosync run`. Returns the result `exit_code` and
    `nosync chaos` read. Raises NosyncError, before any run, for what cannot be judged as asked
    (a usage error, a pipeline that does not load, or a mode and level that cannot survive the
    class: `refusal`), and
    RunFailed for a failure-free run that failed. On a `cluster` (`experiments.cluster`),
    every run goes to its master with its shared tier (`--master`, `--remote`), the sinks write
    there, and a lost machine is a host of it."""
    if mode == "none":
        raise NosyncError("mode none does not recover: a kill fails the run. chaos judges abs, nosync and replay")
    if kills < 1:
        raise NosyncError(f"--kills must be at least 1, got {kills}")
    opts = options or {}
    refused = refusal(mode, failure, opts.get("checkpoint_tier"), opts.get("replicas"), workers, cluster is not None)
    if refused is not None:
        raise NosyncError(refused)
    pipeline_file = os.path.abspath(pipeline_file)
    out = os.path.abspath(out)
    from nosync.api.loader import load_pipeline

    # a pipeline that does not load (PipelineError) is refused too, as each run would refuse it
    load_pipeline(pipeline_file, {**params, "output": os.path.join(out, "reference", "output")})
    if os.path.exists(out) and os.listdir(out):
        raise NosyncError(f"--out {out} is not empty: chaos keeps its runs there, give an empty or new directory")
    os.makedirs(out, exist_ok=True)
    options = dict(options or {})
    if cluster is not None:
        options.update(master=cluster.master, remote=cluster.remote)
    dirs = {name: os.path.join(out, name) for name in ("reference", "reference-2", "chaos")}
    if options.get("remote"):
        # a run's folder on the shared tier is named by its directory's path: one an earlier
        # chaos in the same --out left there would mix its output into these runs'
        left = [shared_of(d, options["remote"]) for d in dirs.values()]
        left = [where for where in left if storage.listdir(where)]
        if left:
            raise NosyncError(
                f"--out {out}: the shared tier already holds runs of an earlier chaos in that directory "
                f"({storage.redact(left[0])}); give a new --out"
            )

    def outputs(run_dir: str) -> dict:
        got = committed_outputs(pipeline_file, {**params, "output": run_output(run_dir, options)})
        got[DEAD_LETTERS] = ("multiset", dead_letters(run_dir))
        return got

    progress("reference run")
    run_reference(pipeline_file, dirs["reference"], mode, workers, params, options, timeout)
    second = {**options, "batch_size": other_batch_size(options.get("batch_size"))}
    progress(
        f"second reference run (determinism): chunks of {second['batch_size']} records, {kills} pause(s) of a worker"
    )
    pauses = random.Random(f"pauses-{seed}")
    summary, paused = run_chaos(
        pipeline_file,
        dirs["reference-2"],
        mode,
        workers,
        params,
        second,
        kill_targets(reference_reads([dirs["reference"]]), kills, pauses),
        pauses,
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
        "failure": failure,
        "seed": seed,
        "kills_requested": kills,
        "reference": dirs["reference"],
        "chaos": dirs["chaos"],
        "reference_2": {
            "batch_size": second["batch_size"],
            "paused": [{"worker": p["workers"][0], "pause_s": round(p["pause_s"], 3)} for p in paused],
        },
    }
    if any(s.get("lost") or s.get("duplicated") for s in again.values()):
        result.update(deterministic=False, exactly_once=None, judged=False, reference_diff=again)
        return result
    rng = random.Random(seed)
    total = reference_reads([dirs["reference"], dirs["reference-2"]])
    targets = kill_targets(total, kills, rng)
    progress(
        f"chaos run: {kills} failure(s) of class {failure}, seed {seed}, at records read "
        f"{', '.join(f'{t:,}' for t in targets)}"
    )
    chaos_options = options
    if failure == "pause":
        # a process paused past the timeout is left to Spark's kill, as on a cluster: it may
        # wake first, a zombie its fence must hold (`--suspect-kill`)
        chaos_options = {**options, "suspect_kill": options.get("suspect_kill") or "spark"}
    summary, done = run_chaos(
        pipeline_file,
        dirs["chaos"],
        mode,
        workers,
        params,
        chaos_options,
        targets,
        rng,
        timeout,
        progress,
        failure=failure,
        cluster=cluster,
    )
    result.update(
        deterministic=True,
        kills=len(done),
        records_read=total,
        kill_targets=targets,
        recovery_s=[k["recovery_s"] for k in done],
        killed=[{x: k[x] for x in KILL_FIELDS if x in k} for k in done],
        detection_s=[k.get("detection_s") for k in done],
        # the attempts replaced while alive, what their fences and their peers refused
        zombies={x: summary.get(x, 0) for x in ZOMBIE_FIELDS},
    )
    if failure in ("pause", "partition"):
        # a pause or cut shorter than the timeout (less a heartbeat's lateness) must not be
        # suspected
        margin = (options.get("failure_timeout_ms") or FAILURE_TIMEOUT_MS) / 1000 - 0.2
        result["suspected_below_timeout"] = sum(
            1 for k in done if k.get("suspected") and k.get("pause_s", k.get("cut_s", 0.0)) < margin
        )
    late = sorted(
        {v for k in done for v, ok in zip(k["workers"], k.get("wiped_before_retry", []), strict=False) if ok is False}
    )
    if late:
        # a retry that may have opened what the wipe then took: not the loss of a machine
        result.update(judged=False, exactly_once=None, wipe_late=late)
        if "failed" in summary:
            result["run_failed"] = summary["failed"]
        return result
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
    if len(done) < kills:
        # the run ended before every kill asked for was made: what it survived is not what was
        # asked, so equal outputs are not judged (records lost or duplicated after the kills
        # made are still not exactly-once)
        result["kills_short"] = True
        if result["exactly_once"] or not result["recoveries"]:
            result.update(judged=False, exactly_once=None)
    elif result.get("suspected_below_timeout") and failure == "pause":
        # a worker replaced for a pause it was allowed: a false suspicion. (A cut shorter than
        # the timeout may be suspected rightly: the beats it dropped come only when TCP sends
        # them again, 0.2 s after the first loss, then 0.4, 0.8, 1.6 s..., after the heal.)
        result["exactly_once"] = False
    elif failure == "stop":
        # nothing is recovered: each stop is judged by the resumed run's output
        result["resumes"] = len(done)
    elif not result["recoveries"] and failure not in ("pause", "partition"):
        # every kill hit a worker whose work was done: nothing recovered, and equal outputs say
        # nothing about a recovery
        result.update(judged=False, exactly_once=None, no_recovery=True)
    return result


ZOMBIE_FIELDS = (
    "zombies",
    "zombies_woke",
    "zombie_commits_refused",
    "zombie_writes_refused",
    "zombie_connections_refused",
    "zombies_gone",
)
"""The run's summary of its replaced attempts (`Coordinator.fencing`): how many, how many woke
and read that they were replaced, the sink commits and shared-tier writes their fences refused,
the connections their peers refused them, and how many had ended when the run did."""


def exit_code(result: dict) -> int:
    """`nosync chaos`'s exit code for a result of `chaos`: 0 exactly-once, every kill asked for
    made; 1 records lost or duplicated, or the run with kills failed; 3 not deterministic; 4
    not judged: the run with kills ended before every kill asked for was made, nothing
    recovered in it (every kill hit a worker whose work was done), or a lost machine's disk
    was wiped only after its retry registered."""
    if not result["deterministic"]:
        return 3
    if result["exactly_once"] is None:
        return 4
    return 0 if result["exactly_once"] else 1

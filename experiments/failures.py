"""The failure classes `nosync chaos` makes, what each one loses, and which levels survive it.

- `process`: a worker's process is killed (SIGKILL). Everything on disk stays: its local
  root `<run dir>/state/w<i>` and the part files its sinks were writing.
- `machine`: the worker's machine is lost: its process is killed and its local disk is gone
  before Spark's retry of its task starts. Right after the kill, the worker's local root is
  renamed away atomically (`state/.lost-w<i>-<n>`, then deleted), and so are the sink part
  files it was writing and had not pre-committed (`part-*-w<i>.*.inprogress` under every
  `_staging/` below the run's output). What lives on the sinks' shared storage (the committed
  output, the pre-committed staged files), the run's own files and the remote tier
  (`<run dir>/remote/`) stay: they are not on the worker's machine. The retry must then
  restore from what survives elsewhere.
- `two`: two distinct workers' machines lost within one interval: the second process is
  killed right after the first (well under 100 ms apart), then both local disks go.
- `hang`: a worker's process is stopped (SIGSTOP) and never resumed: it holds its connections
  open and says nothing. Only the coordinator's failure timeout finds it; it is then killed
  through Spark. Its disk stays, as for `process`.
- `pause`: a worker's process is stopped for a time drawn on both sides of the failure timeout
  (`PAUSE_SHARE` of it), then resumed (SIGCONT). Below the timeout nothing may be recovered;
  above it, the worker is replaced, and the process that wakes is a zombie that must change
  nothing. The run is left to Spark's kill of a suspected worker (`--suspect-kill spark`), as
  on a cluster, so that a zombie may wake before it lands; the chaos JSON counts the zombies,
  those that woke, what their fences refused and those that had ended.

- `partition` (on a cluster of hosts, `--cluster`): the network of the victim's host is cut
  (`Cluster.cut_host`: its link down, packets dropped both ways, no connection reset) for a
  time drawn as a pause's is (`PAUSE_SHARE` of the failure timeout), then restored. Below the
  timeout nothing may be recovered; above it, the worker is replaced (a standby, or Spark's
  retry elsewhere: the kill cannot reach the host), and its process on the healed host is a
  zombie. Nothing of the host is lost.
- `hang-machine` (on a cluster of hosts): every process of the victim's host is stopped
  (SIGSTOP: its Spark worker, executor and Python workers) and never resumed during the run;
  its workers must be replaced elsewhere. After the run the host is killed and started again.
- `stop`: no failure, a clean stop and a resume: the run is sent SIGTERM (as `nosync stop`
  does), must exit 0 having stopped at an epoch boundary, and is started again with
  `--resume`, which must read on from there; the last resumed run goes to the end. Mode
  replay persists nothing to resume from, and is refused.

A mode and checkpoint level that cannot survive a class is refused before any run
(`refusal`): mode replay persists nothing and recomputes from the sources, so it survives
every class; abs and nosync survive a lost machine only with a level off that machine (the
remote tier, or, mode nosync, copies on other workers: `--checkpoint-tier replicated
--replicas R`, one more copy than machines lost at once, since a copy may be on the other lost
machine). A wipe must come before the retry starts, or the retry may have opened what was
wiped: `wiped_before_retry` checks that from the run's events, and chaos judges no run where
it did not hold.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time

from nosync.options import replica_count

FAILURES = ("process", "machine", "two", "hang", "pause", "partition", "hang-machine", "stop")
"""The failure classes: the three that announce themselves, from the least lost to the most,
then the silent ones, of a process and (on a cluster) of a host."""
MACHINES_LOST = {
    "process": 0,
    "machine": 1,
    "two": 2,
    "hang": 0,
    "pause": 0,
    "partition": 0,
    "hang-machine": 0,
    "stop": 0,
}
"""Machines (local disks) each class loses at once."""
SILENT = ("hang", "pause")
"""The classes that stop a process instead of killing it: only the failure timeout finds them."""
OF_HOSTS = ("partition", "hang-machine")
"""The classes that take a host of a cluster (`--cluster`): silent too."""
PAUSE_SHARE = (0.3, 2.5)
"""A `pause` lasts this share of the failure timeout, drawn uniformly: below it, nothing must be
recovered; above it, the worker is replaced and wakes a zombie."""


def refusal(
    mode: str, failure: str, tier: str | None, replicas: int | None, workers: int, cluster: bool = False
) -> str | None:
    """Why a run of `mode` at checkpoint level `tier` (None: `nosync run`'s default, disk) with
    `replicas` copies (None: `nosync run`'s default, one with the replicated tier) on
    `workers` workers cannot face failure class
    `failure`, naming the class and the level it needs; None when it can. Mode none is not a
    question here: chaos refuses it for every class (it does not recover). On a `cluster`, a
    lost process loses its disk too as far as its retry goes: Spark may run the retry on
    another executor (its own local root), on another host."""
    if failure not in FAILURES:
        return f"--failure is one of {', '.join(FAILURES)}, not {failure!r}"
    if failure in OF_HOSTS and not cluster:
        what = "cuts a host's network" if failure == "partition" else "stops every process of a host"
        return f"--failure {failure} {what}: it runs on a cluster of hosts only (--cluster, `nosync cluster up`)"
    if failure == "stop" and mode == "replay":
        return "--failure stop resumes the stopped run: mode replay persists nothing to resume from"
    if failure == "two" and workers < 2:
        return f"--failure two loses two workers' machines at once: it needs -w 2 or more, not -w {workers}"
    lost = max(MACHINES_LOST[failure], 1 if cluster else 0)
    if lost == 0 or mode == "replay":
        # a process's disk survives it; replay persists nothing and recomputes from the sources
        return None
    tier = tier or "disk"
    what = "worker i's local disk" if lost == 1 else "two workers' local disks at once"
    if cluster and failure == "process":
        what = "worker i's local disk to its retry, which Spark may run on another executor"
    elif failure in OF_HOSTS:
        # nothing of the host is lost, but its worker is replaced on another host
        what = "worker i's local disk to its replacement, which runs on another host (a standby, or Spark's retry)"
    head = f"--failure {failure} loses {what}: mode {mode} with --checkpoint-tier {tier}"
    if tier == "remote":
        return None
    if tier == "replicated":
        if mode != "nosync":
            return f"{head} is refused: the replicated level is mode nosync's; use --checkpoint-tier remote"
        replicas = replica_count(tier, replicas)
        given = f"--replicas {replicas}"
        if replicas < lost:
            why = "a copy on another worker" if lost == 1 else "two copies (one may be on the other lost machine)"
            return f"{head} and {given} cannot survive it: it needs {why}; use --replicas {lost}"
        if replicas >= workers:
            return (
                f"{head} and --replicas {replicas} at -w {workers}: a worker's copies go to other workers, "
                f"of which there are {workers - 1}; use --replicas {lost} with -w {lost + 1} or more"
            )
        return None
    other = "replicated, mode nosync" if lost == 1 else "replicated with --replicas 2, mode nosync"
    return f"{head} cannot survive it; use --checkpoint-tier remote (or {other})"


def in_progress_parts(output: str, worker: int) -> list[str]:
    """The sink part files worker `worker` is writing and has not pre-committed: every
    `part-*-w<worker>.*.inprogress` under a `_staging/` directory below `output`."""
    pattern = f"part-*-w{worker:04d}.*.inprogress"
    found = []
    for root, _dirs, files in os.walk(output):
        if os.path.basename(root) == "_staging":
            found += [os.path.join(root, name) for name in files if fnmatch.fnmatch(name, pattern)]
    return found


def lose_machines(run_dir: str, workers: list[int]) -> float:
    """Wipes the local disks of `workers` (their processes just killed): each local root
    `state/w<i>` renamed away at once (a retry that starts from now on finds none), the part
    files they were writing deleted, then the renamed roots deleted. Returns the time
    (`time.time()`) at which nothing of theirs was left to find; a retry that registered before
    it may have opened what was wiped."""
    state = os.path.join(run_dir, "state")
    renamed = []
    for w in workers:
        root = os.path.join(state, f"w{w}")
        lost = os.path.join(state, f".lost-w{w}-{time.time_ns()}")
        try:
            os.rename(root, lost)
        except FileNotFoundError:
            continue  # nothing persisted there (mode replay, or not yet)
        renamed.append(lost)
    for w in workers:
        for path in in_progress_parts(os.path.join(run_dir, "output"), w):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # pre-committed (renamed) or discarded meanwhile
    wiped = time.time()
    for lost in renamed:
        shutil.rmtree(lost, ignore_errors=True)
    return wiped


def wiped_before_retry(events: list[dict], since: int, worker: int, pid: int, wiped: float) -> bool | None:
    """Whether worker `worker`'s retry (its next `registered` event from `events[since]` on,
    with a pid other than `pid`, the killed one's) came after its disk was wiped at `wiped`;
    None when no retry registered."""
    for e in events[since:]:
        if e["event"] == "registered" and e["worker"] == worker and e["pid"] != pid:
            return e["t"] > wiped
    return None

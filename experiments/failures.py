"""Failure classes, simulated on one machine: what a lost worker takes with it.

- `process`: the worker's process dies (SIGKILL); its machine, and so its local disk, survive.
- `machine`: the worker's machine is lost: its process, and its local root
  `<run dir>/state/w<i>` (the disk tier of its stores, their logs, the output log's spill) and
  the part files its sinks were writing (`*.inprogress`, not pre-committed yet). What lives
  outside it stays: the remote tier (`<run dir>/remote/`), the sinks' committed and staged
  output (shared storage), the driver's checkpoint metadata.
- `two`: two workers' machines lost within the same interval.

Which levels survive which class (`needs`): every level survives a process; a machine needs a
copy off the machine (the remote tier, or the replicated level: mode nosync); two machines
need the remote tier or two replicas (one copy may be on the other lost machine). Mode replay
persists nothing and recomputes from the sources: it survives all three.
"""

from __future__ import annotations

import glob
import os
import shutil
import time

CLASSES = ("process", "machine", "two")


def lose_machine(run_dir: str, worker: int) -> float:
    """Takes worker `worker`'s local root and its sinks' in-progress part files away, as its
    machine's loss would; returns the time it was done. The root is renamed first (one atomic
    step, so that a restart never sees half of it), then deleted."""
    state = os.path.join(run_dir, "state")
    root = os.path.join(state, f"w{worker}")
    if os.path.isdir(root):
        gone = os.path.join(state, f".lost-w{worker}-{time.monotonic_ns()}")
        os.rename(root, gone)
        shutil.rmtree(gone, ignore_errors=True)
    pattern = os.path.join(run_dir, "output", "**", "_staging", f"part-*-w{worker:04d}.*.inprogress")
    for path in glob.glob(pattern, recursive=True):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return time.time()


def needs(mode: str, failure: str, tier: str | None, replicas: int | None) -> str | None:
    """Why mode `mode` with its snapshots durable on `tier` (and `replicas` copies) cannot
    survive failure class `failure`, naming the level it needs; None when it can."""
    if failure not in CLASSES:
        return f"--failure is one of {', '.join(CLASSES)}, not {failure!r}"
    if failure == "process" or mode == "replay":
        return None
    tier = tier or "disk"
    r = replicas if replicas is not None else (1 if tier == "replicated" else 0)
    if tier == "remote":
        return None
    if tier == "replicated" and mode == "nosync":
        if failure == "machine" and r >= 1:
            return None
        if failure == "two" and r >= 2:
            return None
        return (
            f"--failure two loses two workers' machines: one of {r} replica(s) may be on the other one. "
            f"Mode nosync needs --replicas 2 or more (or --checkpoint-tier remote)"
        )
    lost = "a worker's local disk" if failure == "machine" else "two workers' local disks"
    other = " (or replicated, mode nosync)" if mode == "nosync" else ""
    return (
        f"--failure {failure} loses {lost}: mode {mode} with --checkpoint-tier {tier} cannot survive it; "
        f"it needs --checkpoint-tier remote{other}"
    )

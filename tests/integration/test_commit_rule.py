"""Mode nosync's per-sink commit rule (docs/modes/nosync.md, "Committing output"): a sink
commits a pre-commit once its own worker's lineage point that holds it is durable, not when
every worker's durable frontier passed its epochs. So the survivors' sinks commit while a lost
worker is away, and the output is still exactly-once once it is back.

The lost worker is held away for as long as the test needs, without any timing: Spark's Python
daemon, which forks the retry of a task, is stopped (SIGSTOP) before the worker is killed
(SIGKILL), so the retry cannot start until the daemon is let go (SIGCONT). Meanwhile the
survivor must commit output of epochs far past any the lost worker reached: under a global safe
point it could not commit past the lost worker's last durable frontier. Expected outputs come
from the generator's definition."""

from __future__ import annotations

import os
import re
import signal
import time

from support.runs import committed_pairs, finish, start_run, wait_event, workers_info
from support.workloads import keyed_count_expected

from experiments.chaos import Events
from experiments.cluster.processes import stat_fields

RECORDS, KEYS = 600_000, 2000
PART = re.compile(r"part-(\d+)-w(\d+)")
MARGIN = 20
"""Epochs past the lost worker's last committed one that the survivor must commit: more than the
flow bound (MAX_EPOCHS_AHEAD) and the epochs a frame in flight can carry together."""


def committed_epochs(out) -> dict[int, int]:
    """Per worker, the greatest epoch of a committed part file (-1: none)."""
    last: dict[int, int] = {0: -1, 1: -1}
    for name in os.listdir(out) if os.path.isdir(out) else ():
        m = PART.match(name)
        if m:
            w = int(m.group(2))
            last[w] = max(last.get(w, -1), int(m.group(1)))
    return last


def test_survivors_commit_while_a_lost_worker_is_away(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    # 40 epochs a second per partition, 7.5 s of input: the loss comes early, and the survivor
    # has hundreds of epochs to read while the lost worker is away
    proc = start_run(
        run_dir,
        "--epoch-records",
        "1000",
        "-p",
        "rate=40000",
        records=RECORDS,
        keys=KEYS,
        out=out,
        mode="nosync",
    )
    daemon = None
    try:
        events = Events(str(run_dir / "events.jsonl"))
        wait_event(events, proc, lambda e: e["event"] == "running", 180, "the run to be running")
        wait_event(events, proc, lambda e: e["event"] == "safe_point" and e["epoch"] >= 5, 60, "some output")
        victim = int(workers_info(run_dir, proc, ("1",), timeout=60)["1"]["pid"])
        daemon = int(stat_fields(victim)[1])  # its parent
        os.kill(daemon, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        wait_event(events, proc, lambda e: e["event"] == "worker_lost" and e["worker"] == 1, 60, "the loss")
        deadline = time.monotonic() + 60
        while True:
            last = committed_epochs(out)
            if last[0] > last[1] + MARGIN:
                break
            assert proc.poll() is None, f"the run ended while worker 1 was away: {proc.communicate()}"
            assert time.monotonic() < deadline, (
                f"worker 0 committed nothing past epoch {last[0]} while worker 1 (last committed epoch "
                f"{last[1]}) was away"
            )
            time.sleep(0.05)
        os.kill(daemon, signal.SIGCONT)
        daemon = None
        stdout, stderr = finish(proc)
        assert proc.returncode == 0, stderr[-3000:]
    finally:
        if daemon is not None:
            os.kill(daemon, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert committed_pairs(str(out)) == keyed_count_expected(RECORDS, KEYS)

"""Running nosync as the user does, and judging what a run did: `nosync chaos` asserted
exactly-once, runs of keyed_count started and waited on by hand, a sink's committed output."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import time

from experiments.chaos import Events, chaos
from support.paths import NOSYNC, ROOT, WORKLOADS


def judge_chaos(
    tmp_path,
    workload: str,
    mode: str,
    workers: int,
    kills: int,
    seed: int,
    params: dict,
    options: dict | None = None,
    failure: str = "process",
    cluster: object = None,
) -> list[dict]:
    """Runs `nosync chaos` on a shipped workload (or a pipeline file, a path ending in .py)
    and asserts exactly-once with every kill recovered (and, for a lost machine, wiped before
    its retry); returns the killed run's events. `cluster`: on that cluster of hosts
    (`experiments.cluster`), a lost machine one of its hosts."""
    r = chaos(
        workload if workload.endswith(".py") else os.path.join(WORKLOADS, f"{workload}.py"),
        mode,
        workers,
        kills,
        seed=seed,
        params=params,
        out=str(tmp_path / "chaos"),
        options=options,
        failure=failure,
        cluster=cluster,
    )
    assert r["deterministic"], r
    assert "run_failed" not in r, r["run_failed"]
    assert r["kills"] == kills, f"only {r['kills']} of {kills} kills happened before the run ended: {r}"
    lost = 2 if failure == "two" else 1
    assert r["recoveries"] == kills * lost, r
    if failure in ("machine", "two"):
        assert all(k["wiped_before_retry"] == [True] * lost for k in r["killed"]), r["killed"]
    assert (r["lost"], r["duplicated"]) == (0, 0), r["sinks"]
    assert r["exactly_once"] is True
    with open(tmp_path / "chaos" / "chaos" / "events.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def committed_pairs(directory: str) -> collections.Counter:
    """The records a Files sink committed in `directory`, as tuples, with their counts."""
    import nosync as ns

    return collections.Counter(tuple(r) for r in ns.sinks.Files(directory).read_committed())


def start_run(
    run_dir,
    *extra: str,
    records: int | str,
    keys: int,
    out,
    mode: str = "abs",
    env: dict | None = None,
    log_to=None,
) -> subprocess.Popen:
    """`nosync run` of keyed_count at W = 2 in a subprocess, with `extra` options. Its output
    goes to pipes, or with `log_to` (a directory) to the files `stdout` and `stderr` there: a
    run that lasts more than a few minutes prints more than a pipe holds, and its driver would
    wait on a pipe nobody reads until the end."""
    cmd = [
        *NOSYNC,
        "run",
        os.path.join(WORKLOADS, "keyed_count.py"),
        "--mode",
        mode,
        "--workers",
        "2",
        "--run-dir",
        str(run_dir),
        *extra,
        "-p",
        f"records={records}",
        "-p",
        f"keys={keys}",
        "-p",
        f"output={out}",
    ]
    env = {**os.environ, **env} if env else None
    if log_to is None:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with open(os.path.join(log_to, "stdout"), "w") as o, open(os.path.join(log_to, "stderr"), "w") as e:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=o, stderr=e, text=True, env=env)


def workers_info(run_dir, proc: subprocess.Popen, workers: tuple[str, ...] = ("0", "1"), timeout: float = 180) -> dict:
    """workers.json (the driver replaces it whole as workers register, at its next sample) once
    it names every one of `workers`; fails if the run ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    path = os.path.join(run_dir, "workers.json")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
            if all(w in info for w in workers):
                return info
        time.sleep(0.05)
    raise AssertionError(f"workers.json named no worker(s) {', '.join(workers)} within {timeout:g}s")


def wait_event(events: Events, proc: subprocess.Popen, pred, timeout: float, what: str) -> dict:
    """The first event of the run for which `pred` holds; fails if the run ends first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in events.poll():
            if pred(e):
                return e
        if proc.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}: {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    """The run's stdout and stderr once it ends; after `timeout` seconds it is killed and
    subprocess.TimeoutExpired raised."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, err

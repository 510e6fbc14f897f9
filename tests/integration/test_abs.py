"""Mode abs under real SIGKILLs of real processes, on embedded Spark.

- `nosync chaos --mode abs` says exactly-once for every shipped workload, W = 2 and 3, 1 to 3
  kills (one combination here; the whole grid, with more seeds, under `make soak`);
- two kills close together: the retry of the first is killed while it restores;
- the driver itself is killed, and `nosync run --resume` finishes the run from its last
  completed checkpoint;
- the newest checkpoint's metadata is damaged before a kill: recovery falls back to the one
  before it, says so, and the output is still exactly-once;
- `--max-restarts` bounds the recoveries; a source that cannot restart is refused at start.

Expected outputs of keyed_count are computed from the generator's definition (record i is
the key str(i % keys); tests/support/workloads.py), never taken from a run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from support import soak
from support.paths import NOSYNC, ROOT
from support.runs import committed_pairs, finish, judge_chaos, start_run, wait_event
from support.workloads import big_text, keyed_count_expected, workload_params

from experiments.chaos import Events

# the suite's share; every workload, worker count and kill count is in the soak grid
CASES = [("wordcount", 2, 1)]


@pytest.mark.parametrize(("workload", "workers", "kills"), CASES)
def test_chaos_abs_is_exactly_once(tmp_path, workload, workers, kills):
    # a smaller text than the soak grid's: three runs of it stay within the suite's time, and
    # its reading lasts several of the coordinator's 0.2 s progress events (at 80,000 lines a
    # fresh-clone run read its last quarter, where the kill's target was, between two of them
    # and ended before the kill)
    big_text(tmp_path / "a.txt", 200_000)
    # checkpoints every 300 ms give the kill something to recover from early in the run
    params = {"input": str(tmp_path / "a.txt")}
    judge_chaos(tmp_path, workload, "abs", workers, kills, 11 * workers + kills, params, {"checkpoint_ms": 300})
    # what `nosync inspect` finds in the run that was killed
    from nosync.tools.runinfo import inspect_run

    info = inspect_run(str(tmp_path / "chaos" / "chaos"))
    assert (info["mode"], info["workers"], info["finished"]) == ("abs", workers, True)
    assert len(info["recoveries"]) == kills and info["regroups"] == kills
    c = info["checkpoints"]
    assert c["completed"] > 0 and c["files"] > 0 and c["bytes"] > 0
    assert {s["worker"] for s in info["stores"]} == set(range(workers))
    assert all(s["last_seq"] == s["disk"] >= 0 for s in info["stores"]), info["stores"]
    # where persistence's time went, by part, as mode nosync reports it
    summary = json.loads((tmp_path / "chaos" / "chaos" / "summary.json").read_text())
    cpu = summary["persist_cpu_s"]
    assert cpu["snapshots"] > 0 and cpu["store"] > 0, cpu
    assert 0 < summary["persist_share"] < 1, summary["persist_share"]


@pytest.mark.soak
@pytest.mark.parametrize(("workload", "workers", "kills", "seed"), soak.cases("abs"))
def test_chaos_abs_soak(tmp_path, workload, workers, kills, seed):
    # wordcount and keyed_count runs last 3 to 5 s on a fast day: at the default 1 s between
    # checkpoints, three kills that each wait for a checkpoint after the last recovery did not
    # fit in them (2026-11-24: the runs ended before their third kill); 300 ms gives them room
    options = {"checkpoint_ms": 300}
    judge_chaos(tmp_path, workload, "abs", workers, kills, seed, workload_params(workload, tmp_path), options)


# -- runs driven by hand -----------------------------------------------------------------


@pytest.mark.soak  # the suite's time: the soak grid kills abs up to 3 times a run
def test_two_kills_close_together(tmp_path):
    """The retry of the first victim is killed while it restores; the run still ends exactly-once."""
    records, keys = 2_000_000, 200_000
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(run_dir, records=records, keys=keys, out=out)
    events = Events(str(run_dir / "events.jsonl"))
    try:
        wait_event(events, proc, lambda e: e["event"] == "checkpoint_completed", 180, "a first checkpoint")
        os.kill(events.pid_of(1), signal.SIGKILL)
        retry = wait_event(
            events,
            proc,
            lambda e: e["event"] == "registered" and e["worker"] == 1 and e["attempt"] >= 1,
            120,
            "a retry",
        )
        os.kill(retry["pid"], signal.SIGKILL)
        second_kill = time.time()
    finally:
        o, e = finish(proc)
    assert proc.returncode == 0, e[-3000:]
    events.poll()
    running = [ev["t"] for ev in events.seen if ev["event"] == "running" and ev["gen"] >= 1]
    assert running and min(running) > second_kill, "the second kill came after the first recovery had finished"
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["recoveries"]) == 2


@pytest.mark.soak  # the suite's time
def test_records_read_again_count_from_the_sources_positions_in_the_checkpoint(tmp_path):
    """A recovery counts what each worker reads again from its sources' positions as the
    restored checkpoint holds them (its file, written by the sources' snapshots), not from
    what they had read by the time the checkpoint was acknowledged."""
    from nosync.state import checkpoints

    records, keys = 3_000_000, 50_000
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(run_dir, "--checkpoint-ms", "300", records=records, keys=keys, out=out)
    events = Events(str(run_dir / "events.jsonl"))
    try:
        for _ in range(3):
            wait_event(events, proc, lambda e: e["event"] == "checkpoint_completed", 180, "three checkpoints")
        os.kill(events.pid_of(1), signal.SIGKILL)
    finally:
        _, err = finish(proc, timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)
    (rec,) = json.loads((run_dir / "summary.json").read_text())["recoveries"]
    body = checkpoints.read(checkpoints.path_of(str(run_dir), rec["checkpoint"]))
    held = {
        str(w): sum(m["records_in"] for m in v["ops"].values() if "records_in" in m) for w, v in body["workers"].items()
    }
    assert rec["read_restored"] == held, (rec, held)
    assert all(n > 0 for n in held.values()), held
    assert rec["records_reprocessed"] > 0, rec


def test_resume_after_the_driver_is_killed_falls_back_past_a_damaged_checkpoint(tmp_path):
    """The driver is SIGKILLed after two checkpoints and its newest checkpoint file is damaged
    (one byte flipped): `--resume` names the damaged file, restores the checkpoint before it
    (the restore a lost worker's regroup makes too: the same choice) and ends exactly-once."""
    from nosync.state import checkpoints

    # checkpoint 2 about 0.6 s into a read of 3 s or more (at the 1 s default, a run once
    # read its whole input before the kill)
    records, keys = 3_000_000, 50_000
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(run_dir, "--checkpoint-ms", "300", records=records, keys=keys, out=out)
    events = Events(str(run_dir / "events.jsonl"))
    try:
        wait_event(
            events,
            proc,
            lambda e: e["event"] == "checkpoint_completed" and e["checkpoint"] >= 2,
            180,
            "two checkpoints",
        )
        pids = [events.pid_of(w) for w in range(2)]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)
    deadline = time.monotonic() + 60
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    assert not committed_pairs(str(out)) == keyed_count_expected(records, keys), "the run had finished already"
    newest = max(checkpoints.completed(str(run_dir)))
    assert newest >= 2
    path = checkpoints.path_of(str(run_dir), newest)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    resumed = start_run(run_dir, "--resume", records=records, keys=keys, out=out)
    _, err = finish(resumed)
    assert resumed.returncode == 0, err[-3000:]
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)
    seen = Events(str(run_dir / "events.jsonl")).poll()
    fallbacks = [e for e in seen if e["event"] == "checkpoint_fallback"]
    assert fallbacks and path in fallbacks[0]["error"] and "checksum" in fallbacks[0]["error"], fallbacks
    restores = [e for e in seen if e["event"] == "restore"]
    assert restores and restores[-1]["checkpoint"] == newest - 1, restores


def test_max_restarts_bounds_recoveries(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(run_dir, "--max-restarts", "0", records=100_000_000, keys=1000, out=out)
    events = Events(str(run_dir / "events.jsonl"))
    try:
        wait_event(events, proc, lambda e: e["event"] == "checkpoint_completed", 180, "a first checkpoint")
        os.kill(events.pid_of(0), signal.SIGKILL)
    finally:
        _, err = finish(proc, timeout=120)
    assert proc.returncode == 1, err[-2000:]
    last = [line for line in err.splitlines() if line.startswith("error:")]
    assert last and "--max-restarts" in last[-1] and "worker 0" in last[-1], err[-2000:]


def test_a_source_that_cannot_restart_is_refused(tmp_path):
    proc = subprocess.run(
        [
            *NOSYNC,
            "run",
            os.path.join(ROOT, "tests", "integration", "pipelines", "tcp_collatz.py"),
            "--mode",
            "abs",
            "--run-dir",
            str(tmp_path / "run"),
            "-p",
            "port=9",
            "-p",
            f"output={tmp_path / 'out'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "TcpLines" in proc.stderr and "mode abs" in proc.stderr and "restart" in proc.stderr

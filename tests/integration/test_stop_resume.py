"""Stopping a run cleanly and resuming it (nosync/driver/stopping.py): a keyed count over a
paced generator is stopped by `--duration` part-way, must say where it stopped with everything
it read committed, and `--resume` must read on from that boundary to the end. The output of
the two runs together must be exactly what the generator's definition gives (record i is the
key str(i % keys)): no record lost, none counted twice. `nosync chaos --failure stop` does the
same through SIGTERM (the soak's chaos cases)."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import soak
from support.paths import NOSYNC, ROOT, WORKLOADS
from support.runs import committed_pairs
from support.workloads import keyed_count_expected, workload_params

import nosync as ns
from experiments.chaos import chaos

RECORDS, KEYS = 240_000, 3000


@pytest.mark.parametrize("mode", ["abs", "nosync"])
def test_a_stopped_run_resumes_exactly_once(spark, tmp_path, mode):
    run_dir, out = str(tmp_path / "run"), str(tmp_path / "out")
    # 2 partitions of 40,000 records/s: 3 s of input, stopped after 1 s of it
    params = {"records": RECORDS, "keys": KEYS, "rate": 40_000, "output": out}
    pipeline = os.path.join(WORKLOADS, "keyed_count.py")
    first = ns.run(pipeline, mode=mode, workers=2, spark=spark, run_dir=run_dir, duration=1.0, params=params)
    s = first.summary
    assert s["stopped"]["reason"] == "--duration 1"
    assert s["stopped"]["epoch"] is not None
    assert 0 < s["records_read"] < RECORDS, "the run was not stopped part-way"
    assert s["records_committed"] == s["records_read"], "a stopped run commits everything it read"
    stopped = committed_pairs(out)
    assert sum(stopped.values()) == s["records_read"]
    again = ns.run(pipeline, mode=mode, workers=2, spark=spark, run_dir=run_dir, resume=True, params=params)
    assert again.summary["stopped"] is None
    assert committed_pairs(out) == keyed_count_expected(RECORDS, KEYS)


def test_stop_refuses_a_directory_without_a_run_and_a_run_that_ended(tmp_path):
    proc = subprocess.run([*NOSYNC, "stop", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no run.json" in proc.stderr and str(tmp_path) in proc.stderr
    (tmp_path / "run.json").write_text('{"run_id": "abc"}')
    (tmp_path / "summary.json").write_text('{"run_id": "abc"}')
    proc = subprocess.run([*NOSYNC, "stop", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "already ended" in proc.stderr
    assert not (tmp_path / "stop").exists()


@pytest.mark.soak
@pytest.mark.parametrize("seed", soak.SEEDS)
@pytest.mark.parametrize("workers", soak.WORKERS)
@pytest.mark.parametrize("mode", ["abs", "nosync"])
@pytest.mark.parametrize("workload", soak.WORKLOADS)
def test_stop_and_resume_soak(tmp_path, workload, mode, workers, seed):
    """`nosync chaos --failure stop`: two SIGTERMs, each run exiting 0 where it stopped and
    resumed, against two runs never stopped."""
    r = chaos(
        os.path.join(WORKLOADS, f"{workload}.py"),
        mode,
        workers,
        2,
        seed=seed,
        params=workload_params(workload, tmp_path),
        out=str(tmp_path / "chaos"),
        failure="stop",
    )
    assert r["deterministic"] and "run_failed" not in r, r
    assert r["kills"] == 2 and r["resumes"] == 2, r
    assert all(k["stopped"]["epoch"] is not None for k in r["killed"]), r["killed"]
    assert (r["lost"], r["duplicated"]) == (0, 0) and r["exactly_once"] is True, r["sinks"]

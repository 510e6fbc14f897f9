"""Mode replay under real SIGKILLs, on embedded Spark: nothing persisted, lost state
recomputed by Spark batch jobs.

- `nosync chaos --mode replay` says exactly-once (keyed_count W = 2 here; every shipped
  workload, W = 2 and 3, 1 and 2 kills, two seeds, under `make soak`); every kill made the
  coordinator hold the run while batch jobs recomputed the state at the end of an epoch
  committed everywhere, and every worker restored it;
- epochs cut by time cannot be recomputed: `--epoch-ms` is refused, exit code 2;
- batch jobs need slots beside the streaming tasks: a master with fewer than 2W is refused,
  saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import soak
from support.paths import ROOT, WORKLOADS
from support.runs import judge_chaos
from support.workloads import workload_params

import nosync as ns
from nosync.errors import NosyncError


def judge(tmp_path, workload: str, workers: int, kills: int, seed: int, params: dict | None = None) -> None:
    events = judge_chaos(
        tmp_path, workload, "replay", workers, kills, seed, params or workload_params(workload, tmp_path)
    )
    kinds = [e["event"] for e in events]
    assert kinds.count("regroup") == kills
    # each loss: recomputed by batch jobs at an epoch every worker had committed, then restored
    recomputed = [e for e in events if e["event"] == "recomputing"]
    restored = [e for e in events if e["event"] == "restore"]
    committed = [e["epoch"] for e in events if e["event"] == "committed"]
    assert len(restored) == kills and all(e["batch_s"] > 0 for e in restored if e["epoch"] >= 0)
    for e in recomputed:
        assert e["epoch"] in committed, f"recomputed epoch {e['epoch']} was never committed everywhere"


@pytest.mark.soak
def test_chaos_replay_is_exactly_once(tmp_path):
    judge(tmp_path, "keyed_count", 2, 1, seed=3, params={"records": "1200000", "keys": "20000"})


@pytest.mark.soak
@pytest.mark.parametrize(("workload", "workers", "kills", "seed"), soak.cases("replay"))
def test_chaos_replay_soak(tmp_path, workload, workers, kills, seed):
    judge(tmp_path, workload, workers, kills, seed)


def test_a_state_that_cannot_be_saved_fails_a_replay_run_as_it_runs(spark, tmp_path):
    """Mode replay saves no state until a worker is lost; a state it could not save then (a
    datetime.date) failed only at that recovery. It fails the run now, naming the operator,
    the key and the type, however short the run."""
    path = os.path.join(ROOT, "tests", "integration", "pipelines", "dated_state.py")
    with pytest.raises(ns.RunFailed) as e:
        ns.run(
            path,
            mode="replay",
            workers=1,  # 2 slots of the session's 3: 1 streaming, 1 for batch jobs
            spark=spark,
            run_dir=str(tmp_path / "run"),
            params={"output": str(tmp_path / "out")},
        )
    msg = str(e.value)
    assert "operator 'last_day' (declared at " in msg and "dated_state.py:" in msg, msg
    assert "cannot store a value of type date: datetime.date(2026, 1, " in msg, msg
    assert "mode replay loads recomputed state from saved bytes" in msg, msg


def test_replay_refuses_epochs_cut_by_time(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "run",
            os.path.join(WORKLOADS, "keyed_count.py"),
            "--mode",
            "replay",
            "--epoch-ms",
            "100",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "mode replay" in proc.stderr and "--epoch-records" in proc.stderr and "--epoch-ms" in proc.stderr


def test_replay_needs_slots_for_its_batch_jobs(spark, tmp_path):
    slots = spark.sparkContext.defaultParallelism
    workers = slots // 2 + 1  # fits the streaming tasks, not the batch jobs beside them
    with pytest.raises(NosyncError) as e:
        ns.run(
            os.path.join(WORKLOADS, "keyed_count.py"),
            mode="replay",
            workers=workers,
            spark=spark,
            run_dir=str(tmp_path / "run"),
            params={"output": str(tmp_path / "out")},
        )
    msg = str(e.value)
    assert f"mode replay: {workers} streaming tasks and {workers} for batch recomputation" in msg
    assert f"{2 * workers} concurrent task slots" in msg and f"offers {slots}" in msg

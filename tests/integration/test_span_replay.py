"""Mode nosync with `--replay-threshold-records`: a recovery hands its span to a Spark job.

A real SIGKILL of a worker of a real run; the committed output is checked against the
generator's definition, and the run's summary must say that the span job was used (so the
test fails if recovery quietly re-executed record by record). Pipelines that cannot use it
are named, with the reason, from their real plans.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from support.paths import PIPELINES, ROOT, WORKLOADS
from support.runs import committed_pairs, finish, judge_chaos, start_run, wait_event
from support.workloads import keyed_count_expected, write_dead_letters_input

from experiments.chaos import Events
from nosync.api.loader import load_pipeline
from nosync.api.plan import plan
from nosync.modes.nosync.span import eligible


def reason_of(path: str, **params: str) -> str | None:
    return eligible(plan(load_pipeline(path, params), 2))


def test_which_pipelines_the_span_job_takes(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"k": "a", "v": 1}\n')
    assert reason_of(os.path.join(WORKLOADS, "keyed_count.py")) is None
    assert reason_of(os.path.join(WORKLOADS, "wordcount.py")) is None
    assert reason_of(os.path.join(PIPELINES, "chaos_dead_letters.py"), input=str(tmp_path), output="y") is None
    assert reason_of(os.path.join(WORKLOADS, "nexmark.py")) == "operator 'bids_per_window' is a window"
    assert (
        reason_of(os.path.join(PIPELINES, "halving_loop.py"), output="y") == "operator 'loop_entry_1' is part of a loop"
    )
    assert reason_of(os.path.join(PIPELINES, "chaos_chain.py"), output="y") == (
        "keyed operator 'totals' is downstream of another keyed operator"
    )


def test_a_threshold_outside_mode_nosync_is_refused(tmp_path):
    got = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", os.path.join(WORKLOADS, "keyed_count.py"), "--mode", "abs"]
        + ["--replay-threshold-records", "1000", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert got.returncode == 2, got.stderr
    assert "--replay-threshold-records is for mode nosync" in got.stderr
    assert not (tmp_path / "run").exists()


RECORDS, KEYS = 2_000_000, 100_000


def test_a_kill_recovers_through_the_span_job(tmp_path):
    # no snapshot before the end (--persist-ms far beyond the run): the span is everything
    # the lost worker did, its survivors are asked for a snapshot that covers the job's cut
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(
        run_dir,
        "--persist-ms",
        "600000",
        "--replay-threshold-records",
        "1000",
        records=RECORDS,
        keys=KEYS,
        out=out,
        mode="nosync",
        env={"PYTHONUNBUFFERED": "1"},
    )
    events = Events(str(run_dir / "events.jsonl"))
    half = threading.Event()

    def watch() -> None:
        for line in proc.stdout:
            m = re.search(r"read=([\d,]+)", line)
            if m and int(m.group(1).replace(",", "")) >= RECORDS // 3:
                half.set()
                return

    threading.Thread(target=watch, daemon=True).start()
    try:
        wait_event(events, proc, lambda e: e["event"] == "running", 180, "the run to be running")
        assert half.wait(180), "the run never read a third of its records"
        os.kill(events.pid_of(1), signal.SIGKILL)
        wait_event(events, proc, lambda e: e["event"] == "recovered", 180, "the recovery")
    finally:
        _, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert committed_pairs(str(out)) == keyed_count_expected(RECORDS, KEYS)
    summary = json.loads((run_dir / "summary.json").read_text())
    (r,) = summary["recoveries"]
    assert r["span_reason"] is None, r
    assert r["span_steps"] > 0 and r["span_records"] > 0, r
    assert not os.listdir(run_dir / "span"), "the job's files stay behind"


SPAN = {"replay_threshold_records": 1000, "persist_ms": 2000}
"""Snapshots every 2 s or more: a kill finds a span of up to a few hundred thousand records,
with cuts every 64 steps (the least), which the threshold hands to the job."""


@pytest.mark.soak
@pytest.mark.parametrize(
    ("workload", "workers", "kills", "seed"),
    [(w, n, k, s) for w in ("keyed_count", "python_state", "dead_letters") for n, k, s in ((2, 1, 1), (3, 2, 2))],
)
def test_chaos_span_soak(tmp_path, workload, workers, kills, seed):
    """`nosync chaos` with the span job: exactly-once, and every recovery says whether it used
    the job or why not.

        .venv/bin/python -m pytest -m soak tests/integration/test_span_replay.py
    """
    if workload == "keyed_count":
        path, params = "keyed_count", {"records": "6000000"}
    elif workload == "python_state":
        path, params = os.path.join(PIPELINES, "python_state.py"), {"records": "1500000"}
    else:
        write_dead_letters_input(tmp_path / "in", lines=800_000)
        path, params = os.path.join(PIPELINES, "chaos_dead_letters.py"), {"input": str(tmp_path / "in")}
    judge_chaos(tmp_path, path, "nosync", workers, kills, seed, params, SPAN)
    summary = json.loads((tmp_path / "chaos" / "chaos" / "summary.json").read_text())
    for r in summary["recoveries"]:
        assert r["span_steps"] > 0 or r["span_reason"], r

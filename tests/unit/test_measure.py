"""`experiments.measure.recovery` without Spark: a stand-in for the run writes the events a
kill waits on and returns a summary built here, and a sleeping process plays the victim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from experiments import measure


@pytest.fixture
def victim():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _event(d: str, event: str, **fields) -> None:
    with open(os.path.join(d, "events.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "event": event, **fields}) + "\n")


def _fake_run(monkeypatch, body) -> None:
    """Replaces the run by `body(d, progress)`, which returns the run's recovery rows."""

    def run(spark, d, mode, workers, records, keys, skew, seed, interval_ms, tier, workload, progress, **opts):
        os.makedirs(d, exist_ok=True)
        return {"records_per_s": 1000.0, "recoveries": body(d, progress)}

    monkeypatch.setattr(measure, "_run", run)


def _row(worker: int, restore_s: float) -> dict:
    return {"worker": worker, "lost_at": time.time(), "restore_s": restore_s, "back_to_90_s": 0.5}


def test_a_recovery_the_harness_did_not_cause_is_no_kill(tmp_path, monkeypatch):
    # the run lost worker 0 by itself (or to a process of an earlier run's kill); the harness
    # never killed its victim, worker 1: no figures, and no crash
    _fake_run(monkeypatch, lambda d, progress: [_row(0, 0.3)])
    d = str(tmp_path / "run")
    got = measure.recovery(None, d, "nosync", 2, 100, 1000, 200, phase=0.8, missed_ok=True)
    assert got["kill_missed"] is True and got["other_recoveries"] == 1
    with pytest.raises(AssertionError, match="ended before the kill"):
        measure.recovery(None, d, "nosync", 2, 100, 1000, 200, phase=0.8)


def test_the_figures_are_those_of_the_recovery_the_kill_caused(tmp_path, monkeypatch, victim):
    def body(d, progress):
        before = _row(0, 9.9)  # a loss of another worker, before the kill
        _event(d, "registered", worker=1, attempt=0, pid=victim.pid)
        _event(d, "checkpoint_completed", n=1)
        progress({"read": 1000, "t": 1.0})  # past kill_after, with a checkpoint: the kill
        assert victim.wait(timeout=5) == -9
        return [before, _row(1, 0.25)]

    _fake_run(monkeypatch, body)
    got = measure.recovery(None, str(tmp_path / "run"), "abs", 2, 100, 1000, 200)
    assert got["kill_missed"] is False
    assert got["restore_s"] == 0.25 and got["other_recoveries"] == 1
    assert got["killed_at_read"] == 1000 and got["suspected_after_s"] >= 0


def test_a_kill_timed_past_the_end_of_its_run_never_comes(tmp_path, monkeypatch, victim):
    # Spark reuses its Python workers: the victim's process outlives the run, and a kill
    # then would make a worker of the next run recover
    def body(d, progress):
        _event(d, "registered", worker=1, attempt=0, pid=victim.pid)
        _event(d, "checkpoint_completed", n=1)
        progress({"read": 1000, "t": 1.0})  # the interval the kill falls in starts after this
        _event(d, "checkpoint_completed", n=2)
        progress({"read": 1000, "t": 1.1})  # the kill is timed 0.5 x 200 ms after checkpoint 2
        return []  # and the run ends first

    _fake_run(monkeypatch, body)
    got = measure.recovery(None, str(tmp_path / "run"), "abs", 2, 100, 1000, 200, phase=0.5, missed_ok=True)
    assert got["kill_missed"] is True
    time.sleep(0.5)
    assert victim.poll() is None, "the victim's process was killed after its run had ended"


def test_caused_by_takes_the_victims_first_loss_at_or_after_the_kill():
    rows = [{"worker": 1, "lost_at": 5.0}, {"worker": 0, "lost_at": 11.0}, {"worker": 1, "lost_at": 12.0}]
    assert measure.caused_by(rows, 1, 10.0) == (rows[2], 2)
    assert measure.caused_by(rows, 1, None) == (None, 3)
    assert measure.caused_by(rows, 1, 13.0) == (None, 3)
    assert measure.caused_by([], 1, 10.0) == (None, 0)

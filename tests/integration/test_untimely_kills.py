"""Kills at moments `nosync chaos` never picks, in every recovering mode (soak).

The judge kills only after the first completed checkpoint, safe point or committed epoch, and
waits for each recovery to end before the next kill. A real `kill -9` comes when it comes:
here worker 0 is killed as soon as the run is running (nothing is checkpointed, durable or
committed yet), and worker 1 as soon as worker 0's retry registers, while that recovery is
under way. keyed_count W = 2; the committed output is checked against the generator's
definition (record i is the key str(i % keys)), never against a run.

    .venv/bin/python -m pytest -m soak tests/integration/test_untimely_kills.py
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from support import soak
from support.runs import committed_pairs, finish, start_run, wait_event
from support.workloads import keyed_count_expected

from experiments.chaos import Events

RECORDS, KEYS = 1_000_000, 100_000


@pytest.mark.soak
@pytest.mark.parametrize("mode", soak.MODES)
def test_a_kill_before_anything_is_saved_and_one_during_its_recovery(tmp_path, mode):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = start_run(run_dir, records=RECORDS, keys=KEYS, out=out, mode=mode)
    events = Events(str(run_dir / "events.jsonl"))
    try:
        wait_event(events, proc, lambda e: e["event"] == "running", 180, "the run to be running")
        saved = [e for e in events.seen if e["event"] in ("checkpoint_completed", "safe_point", "committed")]
        os.kill(events.pid_of(0), signal.SIGKILL)
        wait_event(
            events,
            proc,
            lambda e: e["event"] == "registered" and e["worker"] == 0 and e["attempt"] >= 1,
            120,
            "worker 0's retry",
        )
        os.kill(events.pid_of(1), signal.SIGKILL)
        assert proc.poll() is None, "the run had ended before its second kill"
    finally:
        _, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert not saved, f"the first kill came after the run had saved something: {saved}"
    assert committed_pairs(str(out)) == keyed_count_expected(RECORDS, KEYS)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recoveries"], "nothing recovered"

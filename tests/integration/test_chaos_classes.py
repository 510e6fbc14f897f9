"""`nosync chaos` with its failure classes and its count of kills, on embedded Spark.

- a lost machine (`--failure machine`: the worker killed, its local root and the part files it
  was writing wiped before its retry starts) under mode nosync with the replicated level,
  W = 3: exactly-once, the retry restored from a peer's copy of its store (test_nosync.py has
  the remote tier's case);
- under `make soak`: a lost machine for every mode and level that survives one (abs: remote;
  nosync: remote, replicated, replicated + remote) and two machines lost at once for nosync
  with two replicas, on every shipped workload at W = 3; two machines lost at once under mode
  replay, which persists nothing;
- a run too short for the kills asked for is not judged: exit 4, naming how many of them
  were made.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from support import soak
from support.paths import NOSYNC, ROOT, WORKLOADS
from support.runs import judge_chaos
from support.workloads import committed_vertices, loop_options, workload_params

from experiments.chaos import chaos
from experiments.workloads import reachability

KEYED_COUNT = os.path.join(WORKLOADS, "keyed_count.py")
SMALL = {"records": "1000000", "keys": "20000"}
"""keyed_count small enough for three runs in under a minute, long enough for a kill at W = 3
(the first comes after the first safe point and the victim's first durable snapshot)."""
CLASS_PARAMS = {"reachability": {"vertices": "60000", "seed": "3"}, "keyed_count": SMALL, "nexmark": {"bids": "800000"}}
"""Sizes for one kill at W = 3 (the process grid's are for three); the loops' soak graph."""


def lost_machine(tmp_path, seed: int, options: dict) -> tuple[dict, dict]:
    """`nosync chaos` of keyed_count under nosync, W = 3, one lost machine with `options`:
    judged exactly-once, the one kill made and the victim's disk wiped before its retry.
    Returns the result and the chaos run's summary."""
    r = chaos(
        KEYED_COUNT,
        "nosync",
        3,
        1,
        seed=seed,
        params=SMALL,
        out=str(tmp_path / "chaos"),
        options=options,
        timeout=300,
        failure="machine",
    )
    assert r["deterministic"], r
    assert r["kills"] == 1 and r["killed"][0]["wiped_before_retry"] == [True], r
    assert "run_failed" not in r, r["run_failed"]
    assert (r["lost"], r["duplicated"], r["exactly_once"]) == (0, 0, True), r
    with open(os.path.join(r["chaos"], "summary.json"), encoding="utf-8") as f:
        return r, json.load(f)


@pytest.mark.soak  # the suite loses a host of a cluster at this level (tests/cluster/test_chaos_on_hosts.py)
def test_a_lost_machine_under_nosync_with_the_replicated_level_is_exactly_once(tmp_path):
    r, summary = lost_machine(tmp_path, 1, {"checkpoint_tier": "replicated"})
    assert r["recoveries"] == 1, r
    (rec,) = summary["recoveries"]
    victim = str(r["killed"][0]["workers"][0])
    assert rec["restored_from"] == {victim: "replica"}, rec
    assert rec["restored_step"] > 0, "the retry found nothing to restore: the wipe took what it restores from"


@pytest.mark.soak
@pytest.mark.parametrize(("workload", "mode", "level", "failure"), soak.class_cases())
def test_failure_class_soak(tmp_path, workload, mode, level, failure):
    params = CLASS_PARAMS.get(workload) or workload_params(workload, tmp_path)
    options = {**soak.LEVELS[level], **(loop_options(mode) if workload == "reachability" else {})}
    events = judge_chaos(tmp_path, workload, mode, 3, 1, 3, params, options, failure=failure)
    assert any(e["event"] == "registered" and e.get("attempt", 0) > 0 for e in events)
    if workload == "reachability":
        got = committed_vertices(str(tmp_path / "chaos" / "chaos" / "output"))
        assert set(got) == reachability.reference(params) and set(got.values()) == {1}


@pytest.mark.soak
def test_two_machines_lost_at_once_under_replay_are_exactly_once(tmp_path):
    r = chaos(
        KEYED_COUNT, "replay", 3, 2, seed=2, params=SMALL, out=str(tmp_path / "chaos"), timeout=300, failure="two"
    )
    assert r["deterministic"] and "run_failed" not in r, r
    assert r["kills"] == 2, r
    for k in r["killed"]:
        assert len(set(k["workers"])) == 2 and k["apart_ms"] < 100, k
        assert k["wiped_before_retry"] == [True, True], k
    assert (r["lost"], r["duplicated"]) == (0, 0) and r["exactly_once"] is True, r


@pytest.mark.soak
def test_a_run_shorter_than_its_kills_is_not_judged(tmp_path):
    """60k records end within a second or so of the first safe point: fewer kills than the 5
    asked for (none, as a rule: the first waits for that safe point and the read count of a
    heartbeat after it)."""
    out = tmp_path / "chaos"
    proc = subprocess.run(
        [*NOSYNC, "chaos", KEYED_COUNT, "--mode", "nosync", "-w", "2", "--kills", "5", "--out", str(out)]
        + ["-p", "records=60000", "-p", "keys=2000", "--timeout", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr
    said = re.search(r"not judged: (\d) of 5 kills made before the run ended", proc.stdout)
    assert said is not None, proc.stdout + proc.stderr
    assert int(said.group(1)) < 5


@pytest.mark.soak
def test_levels_that_fell_behind_the_budget_still_recover_a_lost_machine(tmp_path):
    """Replicated + remote with a budget so small that the levels beyond the remote tier fall
    behind (the disk tier's indexing, then the sends to the holder): a lost machine is still
    recovered exactly-once, from the holder's copy, which lags what the remote tier has."""
    _, summary = lost_machine(tmp_path, 4, {"checkpoint_tier": "remote", "replicas": 1, "persist_budget": 0.002})
    assert summary["level_gap_ms_max"].get("disk", 0) > 0, summary["level_gap_ms_max"]

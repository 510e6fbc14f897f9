"""`nosync chaos` with its failure classes and its count of kills, on embedded Spark.

- a lost machine (`--failure machine`: the worker killed, its local root and the part files it
  was writing wiped before its retry starts) under mode nosync with the remote tier, W = 3:
  exactly-once, the retry restored from what lives off the lost machine;
- two machines lost at once under mode replay, which persists nothing (soak);
- a run too short for the kills asked for is not judged: exit 4, naming how many of them
  were made.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from support.paths import NOSYNC, ROOT, WORKLOADS

from experiments.chaos import chaos

KEYED_COUNT = os.path.join(WORKLOADS, "keyed_count.py")
SMALL = {"records": "1500000", "keys": "20000"}
"""keyed_count small enough for three runs in about a minute, long enough for a kill at W = 3
(the first comes after the first safe point, 300k to 400k records in)."""


def test_a_lost_machine_under_nosync_with_the_remote_tier_is_exactly_once(tmp_path):
    r = chaos(
        KEYED_COUNT,
        "nosync",
        3,
        1,
        seed=1,
        params=SMALL,
        out=str(tmp_path / "chaos"),
        options={"checkpoint_tier": "remote"},
        timeout=300,
        failure="machine",
    )
    assert r["deterministic"], r
    assert r["kills"] == 1 and r["killed"][0]["wiped_before_retry"] == [True], r
    assert "run_failed" not in r, r["run_failed"]
    assert (r["lost"], r["duplicated"], r["recoveries"]) == (0, 0, 1), r
    assert r["exactly_once"] is True
    with open(os.path.join(r["chaos"], "summary.json"), encoding="utf-8") as f:
        (rec,) = json.load(f)["recoveries"]
    victim = str(r["killed"][0]["workers"][0])
    assert rec["restored_from"] == {victim: "remote"}, rec
    assert rec["restored_step"] > 0, "the retry found nothing to restore: the wipe took what it restores from"


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

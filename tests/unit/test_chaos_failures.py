"""The failure classes of `nosync chaos` (experiments/failures.py): which mode and checkpoint
level may face which class (every combination, against a table written here), what a lost
machine takes from a run directory and what it leaves, and the check that a wipe came before
the retry. The last tests run `nosync chaos` itself, refused before any run (no Spark)."""

from __future__ import annotations

import itertools
import os
import subprocess

import pytest
from support.paths import NOSYNC, ROOT, WORKLOADS

from experiments.failures import FAILURES, in_progress_parts, lose_machines, refusal, wiped_before_retry

MODES = ("abs", "nosync", "replay")
TIERS = (None, "disk", "remote", "replicated")
REPLICAS = (None, 0, 1, 2, 3, 4)
WORKERS = (1, 2, 3, 4, 5)


def allowed(mode: str, failure: str, tier: str | None, replicas: int | None, workers: int) -> bool:
    """The rules, as a table: who survives what."""
    if failure in ("partition", "hang-machine"):
        return False  # hosts of a cluster only (`--cluster`)
    if failure == "two" and workers < 2:
        return False
    if failure == "stop":
        return mode != "replay"  # nothing is lost; replay persists nothing to resume from
    if failure in ("process", "hang", "pause") or mode == "replay":
        # a stopped process keeps its disk, as a killed one does
        return True
    if tier == "remote":
        return True
    if tier == "replicated" and mode == "nosync":
        need = 1 if failure == "machine" else 2
        copies = 1 if replicas is None else replicas  # nosync run's default on this tier
        return need <= copies < workers
    return False  # the disk tier (the default) is on the lost machine; abs has no replicated level


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("failure", FAILURES)
def test_refusal_of_every_mode_level_and_class(mode, failure):
    for tier, replicas, workers in itertools.product(TIERS, REPLICAS, WORKERS):
        said = refusal(mode, failure, tier, replicas, workers)
        case = (mode, failure, tier, replicas, workers)
        assert (said is None) == allowed(*case), (case, said)
        if said is None:
            continue
        # the message names the class, and what it needs instead
        assert f"--failure {failure}" in said, (case, said)
        if failure in ("partition", "hang-machine"):
            assert "--cluster" in said, (case, said)
        elif failure == "stop":
            assert "mode replay persists nothing" in said, (case, said)
        elif failure == "two" and workers < 2:
            assert "-w 2" in said, (case, said)
        elif tier == "replicated" and mode == "abs":
            assert "mode nosync's" in said and "--checkpoint-tier remote" in said, (case, said)
        elif tier == "replicated":
            assert "--replicas" in said, (case, said)
            if failure == "two" and (replicas or 0) < 2:
                assert "--replicas 2" in said, (case, said)
        else:
            assert "--checkpoint-tier remote" in said and f"mode {mode} with --checkpoint-tier disk" in said, said


@pytest.mark.parametrize("failure", ["partition", "hang-machine"])
def test_a_failure_of_a_host_on_a_cluster_needs_a_level_off_the_host(failure):
    """On a cluster the worker's replacement may run on another host: its disk does not follow."""
    assert refusal("nosync", failure, "replicated", 1, 2, cluster=True) is None
    assert refusal("abs", failure, "remote", None, 2, cluster=True) is None
    assert refusal("replay", failure, None, None, 2, cluster=True) is None
    said = refusal("nosync", failure, "disk", None, 2, cluster=True)
    assert said is not None and f"--failure {failure}" in said and "--checkpoint-tier remote" in said


def test_chaos_refuses_an_out_whose_runs_the_shared_tier_holds_already(tmp_path):
    """A run's folder on the shared tier is named by its directory's path: an earlier chaos in
    the same --out (its local directory since removed) would mix its output into the new runs'."""
    from experiments.chaos import chaos
    from nosync.errors import NosyncError
    from nosync.places import shared_of

    out, remote = tmp_path / "chaos", tmp_path / "shared"
    earlier = os.path.join(shared_of(str(out / "reference"), str(remote)), "output")
    os.makedirs(earlier)
    with open(os.path.join(earlier, "part-0"), "w") as f:
        f.write("an earlier run's output\n")
    with pytest.raises(NosyncError, match="already holds runs of an earlier chaos in that directory"):
        chaos(os.path.join(WORKLOADS, "keyed_count.py"), "nosync", 2, 1, 1, {}, str(out), {"remote": str(remote)})
    assert os.listdir(out) == [], "a run started"


def test_refusal_messages_read_as_the_cli_prints_them():
    assert refusal("abs", "machine", None, None, 3) == (
        "--failure machine loses worker i's local disk: mode abs with --checkpoint-tier disk cannot survive it; "
        "use --checkpoint-tier remote (or replicated, mode nosync)"
    )
    said = refusal("nosync", "two", "replicated", 1, 4)
    assert said is not None and "one may be on the other lost machine" in said and said.endswith("--replicas 2")
    said = refusal("nosync", "machine", "replicated", 2, 2)
    assert said is not None and "of which there are 1" in said
    assert refusal("nosync", "two", "replicated", 2, 3) is None
    assert refusal("replay", "two", None, None, 1) == (
        "--failure two loses two workers' machines at once: it needs -w 2 or more, not -w 1"
    )
    assert "one of process, machine, two" in refusal("nosync", "rack", "remote", None, 3)


def test_a_lost_machine_takes_its_local_root_and_the_parts_it_was_writing(tmp_path):
    run = tmp_path / "run"
    files = {
        # worker 1's local root: everything in it goes
        "state/w1/nosync/disk/000001.ldb": True,
        "state/w1/outlog-a0.spill": True,
        # another worker's, the run's own files, the remote tier: stay
        "state/w0/nosync/disk/000001.ldb": False,
        "remote/w1/seg-1.arrow": False,
        "events.jsonl": False,
        "dead-letter-w1.jsonl": False,
        # worker 1's part files being written, in a sink and in a sink inside it: go
        "output/counts/_staging/part-0000000003-w0001.7.inprogress": True,
        "output/counts/inner/_staging/part-0000000003-w0001.1.inprogress": True,
        # pre-committed staged files and committed output are on the sinks' storage: stay
        "output/counts/_staging/part-0000000002-w0001-c0000000004.parquet": False,
        "output/counts/part-0000000001-w0001.parquet": False,
        # another worker's part being written, and a worker whose index shares digits: stay
        "output/counts/_staging/part-0000000003-w0000.2.inprogress": False,
        "output/counts/_staging/part-0000000003-w0011.2.inprogress": False,
    }
    for name in files:
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    assert sorted(in_progress_parts(str(run / "output"), 1)) == sorted(
        str(run / n) for n, gone in files.items() if gone and n.endswith(".inprogress")
    )
    before = os.times().elapsed
    wiped = lose_machines(str(run), [1])
    assert wiped > 0 and os.times().elapsed - before < 5
    for name, gone in files.items():
        assert (run / name).exists() is not gone, name
    assert not (run / "state" / "w1").exists()
    assert os.listdir(run / "state") == ["w0"], "the renamed root was left behind"
    # a worker with nothing persisted (mode replay) loses nothing, and that is no error
    assert lose_machines(str(run), [2, 1]) > wiped


def test_two_machines_lost_at_once(tmp_path):
    for w in (0, 1, 2):
        (tmp_path / "state" / f"w{w}").mkdir(parents=True)
    lose_machines(str(tmp_path), [2, 0])
    assert os.listdir(tmp_path / "state") == ["w1"]


def test_a_wipe_counts_only_before_the_victims_next_registration():
    events = [
        {"event": "registered", "worker": 1, "pid": 10, "t": 1.0},  # the killed process's own
        {"event": "running", "t": 2.0},
        {"event": "registered", "worker": 0, "pid": 11, "t": 5.5},  # another worker
        {"event": "registered", "worker": 1, "pid": 10, "t": 5.6},  # not a new process
        {"event": "registered", "worker": 1, "pid": 12, "t": 6.0},  # the retry
        {"event": "registered", "worker": 1, "pid": 13, "t": 9.0},  # a later retry
    ]
    assert wiped_before_retry(events, 2, 1, 10, 5.9) is True
    assert wiped_before_retry(events, 2, 1, 10, 6.1) is False
    assert wiped_before_retry(events, 2, 2, 20, 6.1) is None  # no retry registered


def test_chaos_refuses_a_level_that_cannot_survive_the_class_before_any_run(tmp_path):
    out = tmp_path / "chaos"
    proc = subprocess.run(
        [
            *NOSYNC,
            "chaos",
            os.path.join(WORKLOADS, "keyed_count.py"),
            "--mode",
            "nosync",
            "-w",
            "3",
            "--failure",
            "machine",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--failure machine loses worker i's local disk: mode nosync with --checkpoint-tier disk" in proc.stderr
    assert "use --checkpoint-tier remote" in proc.stderr
    assert not out.exists() or not os.listdir(out), "a run started"
    assert "[chaos]" not in proc.stderr


def test_chaos_refuses_two_lost_machines_with_one_worker(tmp_path):
    proc = subprocess.run(
        [*NOSYNC, "chaos", os.path.join(WORKLOADS, "keyed_count.py"), "--mode", "replay", "-w", "1"]
        + ["--failure", "two", "--out", str(tmp_path / "chaos")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--failure two" in proc.stderr and "-w 2 or more" in proc.stderr
    assert not (tmp_path / "chaos").exists()


def test_chaos_refuses_a_pipeline_that_does_not_load_before_any_run(tmp_path):
    """A pipeline whose build raises is a usage error of `nosync chaos` itself, naming the file
    and the error, with no run started (it was told as the reference run's refusal, after a
    directory for the runs was made)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def build(args):\n    raise ValueError('no such table: ' + args['table'])\n")
    out = tmp_path / "chaos"
    proc = subprocess.run(
        [*NOSYNC, "chaos", str(bad), "--mode", "nosync", "-p", "table=t9", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{bad}: build(args) raised ValueError: no such table: t9" in proc.stderr, proc.stderr
    assert "refused its command line" not in proc.stderr and "[chaos]" not in proc.stderr, proc.stderr
    assert not out.exists() or not os.listdir(out), "a run started"

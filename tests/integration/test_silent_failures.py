"""Failures nobody announces, on embedded Spark with real processes: a worker stopped with
SIGSTOP (hung, or paused), a user function that keeps a worker's loop busy, and strangers that
connect and say nothing.

- a hung worker under mode none fails the run, naming the worker and its silence, instead of
  stalling it for ever;
- a hung worker is suspected, killed through Spark, replaced by a standby (`--standbys 1`)
  while Spark's retry of its task stands by, and the run is judged exactly-once by `nosync
  chaos --failure hang` (abs and nosync, keyed_count and nexmark, W = 2 and 3, with a standby
  and without: the soak grid);
- pauses drawn on both sides of the failure timeout (`--failure pause`, soak): exactly-once,
  and no pause shorter than the timeout is suspected;
- a record that keeps its worker's processing loop busy for several failure timeouts is not
  taken for a failure: mode none, which fails on any loss, finishes, its output whole;
- strangers holding silent connections to every worker and to the coordinator make no
  suspicion and no gap in the heartbeats, and those over the cap of pending handshakes are
  refused at once.

Expected outputs come from the generator's definition, never from a run.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess

import pytest
from support.paths import NOSYNC, PIPELINES, ROOT, WORKLOADS
from support.runs import committed_pairs, finish, judge_chaos, wait_event, workers_info
from support.workloads import keyed_count_expected

from experiments.chaos import Events, chaos
from nosync.runtime import channels


def run_cmd(pipeline: str, run_dir, mode: str, *extra: str, **params) -> subprocess.Popen:
    cmd = [*NOSYNC, "run", pipeline, "--mode", mode, "--workers", "2", "--run-dir", str(run_dir), *extra]
    for k, v in params.items():
        cmd += ["-p", f"{k}={v}"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_hung_worker_fails_a_mode_none_run_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cmd(
        os.path.join(WORKLOADS, "keyed_count.py"),
        run_dir,
        "none",
        "--failure-timeout-ms",
        "1000",
        records=1_000_000_000,
        output="none",
    )
    victim = None
    try:
        events = Events(str(run_dir / "events.jsonl"))
        wait_event(events, proc, lambda e: e["event"] == "running", 180, "the run to be running")
        victim = workers_info(run_dir, proc)["1"]["pid"]
        os.kill(victim, signal.SIGSTOP)
        # a run that stalled for ever would not end here
        _, err = finish(proc, timeout=120)
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1, err[-3000:]
    last = [line for line in err.splitlines() if line.startswith("error:")]
    assert last and "worker 1" in last[-1] and "no heartbeat" in last[-1], err[-3000:]
    events.poll()
    suspected = [e for e in events.seen if e["event"] == "suspected"]
    assert [e["worker"] for e in suspected] == [1], suspected


def hang_judged(tmp_path, workload: str, mode: str, workers: int, seed: int, params: dict, standbys: int) -> list:
    """`nosync chaos --failure hang` judged exactly-once; the hung worker suspected once, and
    replaced by a standby (`standbys`) or by Spark's next attempt of its killed task."""
    # abs checkpoints every 300 ms: something to recover from early in the run
    options = {"standbys": standbys, **({"checkpoint_ms": 300} if mode == "abs" else {})}
    events = judge_chaos(tmp_path, workload, mode, workers, 1, seed, params, options, failure="hang")
    suspected = [e for e in events if e["event"] == "suspected"]
    assert len(suspected) == 1, suspected
    w = suspected[0]["worker"]
    later = [e for e in events if e["event"] == "registered" and e["worker"] == w and e["t"] > suspected[0]["t"]]
    assert later and later[0]["attempt"] > suspected[0]["attempt"], later
    promoted = [e for e in events if e["event"] == "promoted"]
    if standbys:
        # the standby took the index: its pid is the replacement's
        assert [(e["worker"], e["pid"]) for e in promoted] == [(w, later[0]["pid"])], promoted
    else:
        assert promoted == []
    return events


def test_a_hung_worker_is_replaced_by_a_standby_and_the_output_is_exactly_once(tmp_path):
    events = hang_judged(tmp_path, "nexmark", "nosync", 2, 5, {"bids": "800000"}, 1)
    assert not [e for e in events if e["event"] == "regroup"], "a single lost worker made every worker restore"
    # Spark's retry of the killed task stood by in the standby's place
    assert [e for e in events if e["event"] == "standby" and e["task_index"] < 2], "the retry did not stand by"


@pytest.mark.soak
@pytest.mark.parametrize("standbys", [0, 1])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("workload", ["keyed_count", "nexmark"])
@pytest.mark.parametrize("mode", ["abs", "nosync"])
def test_hang_soak(tmp_path, mode, workload, workers, standbys):
    """`nosync chaos --failure hang` on keyed_count and nexmark, W = 2 and 3, with a standby
    and without (Spark's next attempt of the killed task)."""
    params = {"records": "2000000", "keys": "20000"} if workload == "keyed_count" else {"bids": "1200000"}
    hang_judged(tmp_path, workload, mode, workers, 7 * workers + standbys, params, standbys)


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["abs", "nosync"])
def test_pauses_on_both_sides_of_the_timeout_are_exactly_once(tmp_path, mode):
    r = chaos(
        os.path.join(WORKLOADS, "keyed_count.py"),
        mode,
        2,
        3,
        seed=4,
        params={"records": "2000000", "keys": "20000"},
        out=str(tmp_path / "chaos"),
        options={"checkpoint_ms": 300} if mode == "abs" else {},
        failure="pause",
    )
    assert r["deterministic"], r
    assert "run_failed" not in r, r.get("run_failed")
    assert r["kills"] == 3, r
    assert (r["lost"], r["duplicated"]) == (0, 0), r["sinks"]
    assert r["suspected_below_timeout"] == 0, r["killed"]
    assert r["exactly_once"] is True, r
    # the seed draws pauses on both sides of the timeout: both kinds were made
    timeout_s = 1.5
    pauses = [k["pause_s"] for k in r["killed"]]
    assert min(pauses) < timeout_s < max(pauses), pauses
    longer = [k for k in r["killed"] if k["pause_s"] > timeout_s + 0.3]
    assert all(k["suspected"] for k in longer), r["killed"]
    # each suspected process was replaced alive (Spark's kill only): a zombie, ended by the
    # run's end whether it woke and stopped by itself or Spark's kill reached it first
    z = r["zombies"]
    suspected = sum(1 for k in r["killed"] if k["suspected"])
    assert z["zombies"] == suspected and z["zombies_gone"] == suspected, z


def test_a_busy_loop_is_not_taken_for_a_failure(tmp_path):
    """The failure timeout is 500 ms; one record keeps its worker's loop busy for 3 s. Mode
    none fails on any loss, so a suspicion would fail the run."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    proc = run_cmd(
        os.path.join(PIPELINES, "busy_record.py"),
        run_dir,
        "none",
        "--failure-timeout-ms",
        "500",
        records=20_000,
        busy_s=3,
        output=out,
    )
    _, err = finish(proc, timeout=300)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["suspicions"] == 0
    assert committed_pairs(str(out)) == collections.Counter({(str(i), 1): 1 for i in range(20_000)})


def test_strangers_silent_connections_make_no_suspicion_and_no_heartbeat_gap(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    records, keys = 2_000_000, 10_000
    proc = run_cmd(os.path.join(WORKLOADS, "keyed_count.py"), run_dir, "nosync", records=records, keys=keys, output=out)
    strangers: list[socket.socket] = []
    over_cap = []
    try:
        events = Events(str(run_dir / "events.jsonl"))
        coordinator = wait_event(events, proc, lambda e: e["event"] == "coordinator", 180, "the coordinator")
        wait_event(events, proc, lambda e: e["event"] == "running", 180, "the run to be running")
        targets = [tuple(coordinator["address"])]
        targets += [tuple(w["address"]) for w in workers_info(run_dir, proc).values()]
        for address in targets:
            # more than the cap of pending handshakes: those past it are closed at once
            for _ in range(channels.MAX_PENDING_HANDSHAKES + 4):
                s = socket.create_connection(address, timeout=10)
                strangers.append(s)
        for s in strangers:
            s.settimeout(2.0)
            try:
                got = s.recv(64, socket.MSG_PEEK)
            except TimeoutError:
                got = None
            except ConnectionResetError:
                got = b""
            if got == b"":
                over_cap.append(s)
        _, err = finish(proc, timeout=300)
    finally:
        for s in strangers:
            s.close()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["suspicions"] == 0
    assert summary["longest_silence_s"] < 1.0, summary["longest_silence_s"]
    assert len(over_cap) == 4 * len(targets), f"{len(over_cap)} strangers closed at once"
    assert summary["refused_connections"] >= 4 * len(targets)
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)


def test_more_standbys_than_the_master_has_slots_for_is_refused_naming_both(tmp_path):
    proc = run_cmd(
        os.path.join(WORKLOADS, "keyed_count.py"),
        tmp_path / "run",
        "nosync",
        "--master",
        "local[2]",
        "--standbys",
        "1",
        records=1000,
        output="none",
    )
    _, err = finish(proc, timeout=120)
    assert proc.returncode == 2, err[-3000:]
    said = [line for line in err.splitlines() if line.lower().startswith("error:")]
    assert said and "--standbys 1" in said[-1] and "3 concurrent task slots" in said[-1] and "offers 2" in said[-1], err

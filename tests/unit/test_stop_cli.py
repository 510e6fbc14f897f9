"""`nosync stop --wait` against run directories whose run ends while it waits, without Spark:
the run's driver is a real process started here, its events written by the driver's own
`RowLog`. A run that fails or whose driver dies must end the wait at once with exit 1, naming
the run directory and what happened, not after --timeout; one whose summary comes says where
it stopped, exit 0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from support.paths import NOSYNC, ROOT

from nosync.driver.rows import RowLog

WAIT_S = 60
"""How long a test lets `nosync stop` take: far more than it needs once the run ended, far less
than its --timeout (a stop that only gives up at --timeout fails the test)."""
TIMEOUT = ["--timeout", "3600"]


def write_run(run_dir, **fields) -> None:
    (run_dir / "run.json").write_text(json.dumps({"pipeline": "keyed_count", "run_id": "r2", **fields}))


def start_stop(run_dir) -> subprocess.Popen:
    """`nosync stop RUN_DIR --wait`, once it has asked the run to stop."""
    proc = subprocess.Popen(
        [*NOSYNC, "stop", str(run_dir), "--wait", *TIMEOUT],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + WAIT_S
    while not (run_dir / "stop").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "nosync stop never wrote its request"
        time.sleep(0.05)
    return proc


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    """What `nosync stop` printed once it ended; killed if it has not within WAIT_S."""
    try:
        return proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def driver_process() -> subprocess.Popen:
    """A stand-in for a run's driver: a process that lives until its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def test_stop_wait_ends_when_the_run_fails_meanwhile(tmp_path):
    events = RowLog(str(tmp_path / "events.jsonl"), append=True)
    # an earlier run in the directory that failed is not this one's failure
    events.append({"t": time.time() - 600, "event": "failed", "gen": 0, "reason": "an earlier run's"})
    write_run(tmp_path, resumed=True)
    events.append({"t": time.time(), "event": "coordinator", "gen": 0, "address": ["127.0.0.1", 1]})
    stop = start_stop(tmp_path)
    events.append({"t": time.time(), "event": "failed", "gen": 1, "reason": "worker 1 lost in mode none"})
    events.close()
    out, err = finish(stop)
    assert stop.returncode == 1, (out, err)
    assert str(tmp_path) in err and "failed: worker 1 lost in mode none" in err
    assert "an earlier run's" not in err
    assert not (tmp_path / "stop").exists(), "a request no run will read is left behind"


def test_stop_wait_ends_when_the_runs_driver_dies_meanwhile(tmp_path):
    driver = driver_process()
    try:
        write_run(tmp_path, driver={"host": socket.gethostname(), "pid": driver.pid})
        stop = start_stop(tmp_path)
        assert stop.poll() is None  # the driver lives: the stop waits
    finally:
        driver.stdin.close()
        driver.wait(timeout=WAIT_S)  # reaped: its pid names no process now
    out, err = finish(stop)
    assert stop.returncode == 1, (out, err)
    assert str(tmp_path) in err and f"pid {driver.pid}" in err and "left no summary" in err


def test_stop_refuses_a_run_whose_driver_is_already_gone(tmp_path):
    driver = driver_process()
    driver.stdin.close()
    driver.wait(timeout=WAIT_S)
    write_run(tmp_path, driver={"host": socket.gethostname(), "pid": driver.pid})
    proc = subprocess.run(
        [*NOSYNC, "stop", str(tmp_path), *TIMEOUT], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S
    )
    assert proc.returncode == 2, proc
    assert "already ended" in proc.stderr and f"pid {driver.pid}" in proc.stderr
    assert not (tmp_path / "stop").exists()


def test_stop_wait_says_where_the_run_stopped(tmp_path):
    driver = driver_process()
    try:
        write_run(tmp_path, driver={"host": socket.gethostname(), "pid": driver.pid})
        stop = start_stop(tmp_path)
        summary = {"run_id": "r2", "records_committed": 12345, "stopped": {"reason": "nosync stop", "epoch": 7}}
        (tmp_path / "summary.json.tmp").write_text(json.dumps(summary))
        os.replace(tmp_path / "summary.json.tmp", tmp_path / "summary.json")
    finally:
        driver.stdin.close()
        driver.wait(timeout=WAIT_S)
    out, err = finish(stop)
    assert stop.returncode == 0, (out, err)
    assert "stopped at epoch 7" in out and "12,345 records committed" in out

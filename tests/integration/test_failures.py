"""Mode none under a real SIGKILL: the run fails with a clear message and exit code 1, fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOSYNC = [sys.executable, "-m", "cli.main"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_sigkill_of_a_worker_fails_the_run_in_mode_none(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            *NOSYNC,
            "run",
            os.path.join(ROOT, "experiments", "workloads", "keyed_count.py"),
            "--mode",
            "none",
            "--workers",
            "2",
            "--run-dir",
            str(run_dir),
            "-p",
            "records=1000000000",
            "-p",
            "output=none",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def registered():
            path = run_dir / "workers.json"
            if proc.poll() is not None:
                raise AssertionError(f"the run ended early: {proc.communicate()}")
            if not path.exists():
                return None
            info = json.loads(path.read_text())
            return info if len(info) == 2 else None

        info = wait_for(registered, 180, "both workers to register")
        victim = info["1"]["pid"]
        assert victim != os.getpid() and victim > 0
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (out, err)
    assert elapsed < 10, f"the run took {elapsed:.1f}s to fail"
    last = [line for line in err.splitlines() if line.startswith("error:")]
    assert last and "worker 1" in last[-1] and "lost" in last[-1], err[-2000:]

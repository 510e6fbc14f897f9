"""`nosync run` whose standard output nobody reads: the run still stops at its `--duration`.

The loop that prints a progress line each second is the one that acts on `--duration` and
`nosync stop`; a pipe nobody reads fills, and a write to it would hold that loop for ever. The
pipe here is made full before the run starts (its size set to one page), so the first line
would wait."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time

import pytest
from support.paths import NOSYNC, ROOT, WORKLOADS


def full_pipe() -> tuple[int, int]:
    """A pipe (read end, write end) of one page, filled."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def drain(fd: int) -> bytes:
    """What `fd` holds now (non-blocking: the run's children may hold the pipe open a while
    after the run ended)."""
    out = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        out.append(chunk)
    return b"".join(out)


@pytest.mark.soak  # about 75 s: after the stop, a worker's task is retried for a minute (see testing.md)
def test_a_run_whose_output_nobody_reads_stops_at_its_duration(tmp_path):
    run_dir = tmp_path / "run"
    r, w = full_pipe()
    cmd = [*NOSYNC, "run", os.path.join(WORKLOADS, "keyed_count.py"), "--mode", "none", "--workers", "2"]
    cmd += ["--run-dir", str(run_dir), "--duration", "3", "-p", "records=none", "-p", "rate=2000"]
    cmd += ["-p", "keys=100", "-p", "output=none"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=w, stderr=err)
    os.close(w)
    summary = run_dir / "summary.json"
    printed = b""
    try:
        # the summary is written before it is printed: it comes while stdout is still full
        deadline = time.monotonic() + 240
        while not summary.exists():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not stop within 240 s of its start (--duration 3)"
            time.sleep(0.1)
        os.set_blocking(r, False)
        deadline = time.monotonic() + 60
        while proc.poll() is None:  # room for the summary now
            printed += drain(r)
            assert time.monotonic() < deadline, "the run did not exit within 60 s of its summary"
            time.sleep(0.05)
        printed += drain(r)
        assert proc.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(r)
    stopped = json.loads(summary.read_text())["stopped"]
    assert stopped is not None and "--duration" in stopped["reason"], stopped
    assert b"records committed" in printed  # the summary was printed once there was room

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
import threading
import time

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


def drain(fd: int, into: list[bytes]) -> None:
    """Reads `fd` until every writer closed it, then closes it."""
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read1(65536):
            into.append(chunk)


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
    chunks: list[bytes] = []
    reader = None
    try:
        # the summary is written before it is printed: it comes while stdout is still full
        deadline = time.monotonic() + 240
        while not summary.exists():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not stop within 240 s of its start (--duration 3)"
            time.sleep(0.1)
        reader = threading.Thread(target=drain, args=(r, chunks), daemon=True)
        reader.start()  # room for the summary now
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if reader is None:
            os.close(r)
    reader.join(timeout=60)  # the run's children (Spark's) hold the pipe until they end
    printed = b"".join(chunks)
    stopped = json.loads(summary.read_text())["stopped"]
    assert stopped is not None and "--duration" in stopped["reason"], stopped
    assert b"records committed" in printed  # the summary was printed once there was room

"""Reading /proc for a process: its state, its parent, whether it is stopped or gone, on a real
child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from experiments.cluster.processes import cmdline, is_stopped, running, stat_fields


def wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.01)


def test_a_child_is_running_then_stopped_then_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "a (b) c"])
    try:
        fields = stat_fields(child.pid)
        assert fields is not None and int(fields[1]) == os.getpid()  # field 4: the parent
        assert running(child.pid) and not is_stopped(child.pid)
        assert cmdline(child.pid)[-1] == "a (b) c"
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: is_stopped(child.pid), "stopped state")
        os.kill(child.pid, signal.SIGCONT)
        wait_for(lambda: not is_stopped(child.pid), "running state")
    finally:
        child.kill()
        child.wait()
    assert stat_fields(child.pid) is None and not running(child.pid) and cmdline(child.pid) == []

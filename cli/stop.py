"""`nosync stop`: stop a running run cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from typing import NamedTuple

import click

POLL_S = 0.2
"""How often `--wait` looks at the run directory."""
CLOCK_SLACK_S = 1.0
"""How much older than run.json's mtime an event of the run may look (a file system's coarse
mtime); a run that failed before started its successor longer ago than that."""


class Ended(NamedTuple):
    """How the run ended: cleanly (its summary is there: stopped or finished) or not."""

    clean: bool
    what: str


@click.command("stop")
@click.argument("run_dir", type=click.Path())
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the run to have stopped.")
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True, help="Seconds to wait."
)
def stop_cmd(run_dir: str, wait: bool, timeout: float) -> None:
    """Stop the run in RUN_DIR cleanly: its sources stop at an epoch boundary, everything read
    before it is committed, a last checkpoint (abs) or snapshot (nosync) is taken, and the run
    exits 0. `nosync run --resume --run-dir RUN_DIR` reads on from there. The same as SIGINT or
    SIGTERM to `nosync run`; the request is a file in RUN_DIR, so any host that shares it may
    ask.

    Exit 2: no run in RUN_DIR, or it has already ended. Exit 1: the run failed (its events say
    so) or its driver's process is gone without a summary while waiting, or it had not stopped
    after --timeout."""
    from nosync.driver.stopping import read_json, stop_file

    run = read_json(os.path.join(run_dir, "run.json"))
    if not run:
        click.echo(f"error: {run_dir}: no run.json there, so no run to stop", err=True)
        sys.exit(2)
    failures = Failures(run_dir)
    ended = how_it_ended(run_dir, run, failures)
    if ended is not None:
        click.echo(f"error: the run in {run_dir} (run {run.get('run_id')}) has already ended: {ended.what}", err=True)
        sys.exit(2)
    with open(stop_file(run_dir), "w", encoding="utf-8") as f:
        f.write(json.dumps({"asked_at": time.time(), "pid": os.getpid()}) + "\n")
    click.echo(f"asked the run in {run_dir} to stop")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = how_it_ended(run_dir, run, failures)
        if ended is not None and ended.clean:
            click.echo(ended.what)
            return
        if ended is not None:
            # nothing will act on the request: the next run in the directory starts afresh
            with contextlib.suppress(FileNotFoundError):
                os.remove(stop_file(run_dir))
            click.echo(f"error: the run in {run_dir} ended without stopping: {ended.what}", err=True)
            sys.exit(1)
        time.sleep(POLL_S)
    click.echo(f"error: the run in {run_dir} had not stopped after {timeout:g} s (its request stays)", err=True)
    sys.exit(1)


def how_it_ended(run_dir: str, run: dict, failures: Failures) -> Ended | None:
    """How the run of `run` (its run.json) in `run_dir` ended; None while it may still run.
    Cleanly: its summary.json is there. Not: its events say it failed, or its driver's process
    (run.json's `driver`, when it is on this host) is gone without a summary."""
    from nosync.driver.stopping import read_json

    driver = run.get("driver") or {}
    gone = driver.get("host") == socket.gethostname() and not alive(driver.get("pid"))
    # read after the look at the process: a summary written just before it exited is seen
    summary = read_json(os.path.join(run_dir, "summary.json"))
    if summary.get("run_id") == run.get("run_id"):
        committed = f"{summary.get('records_committed', 0):,} records committed"
        stopped = summary.get("stopped")
        if stopped:
            return Ended(True, f"stopped at epoch {stopped.get('epoch')} after {stopped.get('stop_s')} s: {committed}")
        return Ended(True, f"finished its input: {committed}")
    reason = failures.reason()
    if reason is not None:
        return Ended(False, f"it failed: {reason}")
    if gone:
        return Ended(False, f"its driver (pid {driver['pid']} on {driver['host']}) is gone and left no summary")
    return None


def alive(pid: object) -> bool:
    """Whether process `pid` of this host exists (True when `pid` is not a pid: unknown).
    A recycled pid looks alive: then only --timeout ends the wait."""
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Failures:
    """The run's `failed` event in the run directory's events.jsonl, read on from where the
    last look stopped (the file grows for as long as the run goes). Events older than run.json
    are an earlier run's: a run resumed in the same directory appends to the same file."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, "events.jsonl")
        try:
            self.since = os.stat(os.path.join(run_dir, "run.json")).st_mtime - CLOCK_SLACK_S
        except OSError:
            self.since = 0.0
        self.offset = 0
        self.found: str | None = None

    def reason(self) -> str | None:
        """The reason of the run's `failed` event, if it has one by now."""
        if self.found is not None:
            return self.found
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    self.offset = 0  # a new file
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return None
        whole = data.rfind(b"\n") + 1  # a line being written is read once it is whole
        self.offset += whole
        for line in data[:whole].splitlines():
            if b'"failed"' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("event") == "failed" and _time(ev) >= self.since:
                self.found = str(ev.get("reason"))
                return self.found
        return None


def _time(event: dict) -> float:
    try:
        return float(event.get("t") or 0)
    except (TypeError, ValueError):
        return 0.0

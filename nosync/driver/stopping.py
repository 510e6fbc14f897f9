"""Stopping a run cleanly: `nosync stop RUN_DIR`, SIGINT or SIGTERM to `nosync run`, or
`--duration`.

The coordinator asks every worker to stop (`control.Stop()`): its sources read no more and
close the epoch they are in. Each worker's heartbeat then says where its sources stopped
(`stopped`: the last epoch closed, and the boundary it was asked to close up to). Once every
worker has stopped, the coordinator picks the greatest of those epochs, E, and asks every
worker to close its sources up to E (`control.Stop(E)`), so that the whole run ends at one
boundary: every sink's frontier passes E, the mode commits everything before it and takes its
last checkpoint (abs) or snapshot (nosync), and each worker reports done at E. A resumed run
(`--resume`) restores that checkpoint or snapshot and reads on from epoch E + 1.

A worker that is lost meanwhile is recovered as in any run, and told to stop again once it
runs (a nosync replay stops its sources where its log says, a logged step). Should it stop
past E, E moves up to where it stopped and every worker closes up to the new E; a worker
done at an older E is done again at the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from nosync.runtime import control

RESEND_S = 0.5
"""How often a worker that has not yet done what the stop asks is asked again (it may have
been lost and recovered meanwhile, or not yet run its restored generation)."""

STOP_FILE = "stop"
"""The file in the run directory that `nosync stop` writes (the run's driver polls for it)."""

CLOCK_FILE = "source-clock.json"
"""The file in the run directory that says when the run's source clock started."""


class Stopping:
    """The stop of one run, driven from the coordinator's loop (`tick`)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.reason: str | None = None
        """Why the run stops (None: it is not stopping)."""
        self.asked_at: float | None = None
        self.upto: int | None = None
        """The epoch boundary the run ends at, once every worker stopped."""
        self._sent: dict[int, tuple[Any, float]] = {}
        self._announced = False

    def request(self, reason: str) -> bool:
        """Asks the run to stop, for `reason` (from any thread: the coordinator's loop acts on
        it); False if it was asked already."""
        if self.reason is not None:
            return False
        self.reason, self.asked_at = reason, time.time()
        return True

    def tick(self, coord: Any) -> None:
        """Asks each worker for what it has not yet done of the stop (`control.Stop`)."""
        if self.reason is None or coord.finished or coord.failure is not None:
            return
        if not self._announced:
            self._announced = True
            coord.event("stop_requested", reason=self.reason)
        with coord._lock:
            counters = {w: dict(coord.counters.get(w) or {}) for w in range(self.workers)}
        stopped = {w: c.get("stopped") for w, c in counters.items() if c.get("positioned") and c.get("stopped")}
        if len(stopped) == self.workers:
            top = max(int(s[0]) for s in stopped.values())
            if self.upto is None or top > self.upto:
                self.upto = top
                coord.event("stopping", epoch=top, reason=self.reason)
                # a worker done at an older boundary is done again at this one
                for w in [w for w, d in coord.done.items() if _drained(d["metrics"]) != top]:
                    del coord.done[w]
        now = time.monotonic()
        for w in range(self.workers):
            s = stopped.get(w)
            if s is not None and (self.upto is None or s[1] == self.upto):
                continue
            want = self.upto
            sent = self._sent.get(w)
            if sent is not None and sent[0] == want and now - sent[1] < RESEND_S:
                continue
            self._sent[w] = (want, now)
            coord.send(w, control.Stop(want))

    def accepts_done(self, metrics: dict) -> bool:
        """Whether a worker's `Done` counts: in a stopping run, only once it is done at the
        boundary the run ends at (one done at an older boundary, or before it stopped, goes on)."""
        if self.reason is None:
            return True
        return self.upto is not None and _drained(metrics) == self.upto

    def summary(self, finished_at: float) -> dict | None:
        """What the run summary says of the stop (None: the run was not stopped)."""
        if self.reason is None:
            return None
        return {
            "reason": self.reason,
            "epoch": self.upto,
            "stop_s": None if self.asked_at is None else round(finished_at - self.asked_at, 3),
        }


def _drained(metrics: dict) -> int | None:
    s = metrics.get("stopped")
    return None if not s else s[1]


def stop_file(run_dir: str) -> str:
    """The path of the stop request of the run in `run_dir`."""
    return os.path.join(run_dir, STOP_FILE)


def check_requests(coord: Any, run_dir: str, duration: float | None) -> None:
    """Asks the run to stop when `nosync stop` wrote its request, or `--duration` seconds
    went by since the workers started (Spark's start-up not counted)."""
    if coord.stopping.reason is not None:
        return
    if os.path.exists(stop_file(run_dir)):
        coord.stopping.request("nosync stop")
    elif duration is not None and coord.ran_for() >= duration:
        coord.stopping.request(f"--duration {duration:g}")


@contextlib.contextmanager
def stop_signals(coord: Any) -> Iterator[None]:
    """While the run goes: the first SIGINT or SIGTERM stops it cleanly (`Stopping`); a second
    one stops it at once, as a failure (`--resume` then recovers from the last checkpoint or
    snapshot). Outside the main thread, signals are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if not coord.stopping.request(name):
            coord.fail(f"stopped at once by a second signal ({name}) while stopping cleanly")

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class SourceClock:
    """The run's source clock: a paced source's record j of a partition is due j / rate after
    its start (`Generator(rate=...)`). It starts when the first generation is released to the
    workers, not at launch (Spark's start-up is no backlog), and every later attempt gets the
    same start in its `Peers`; the start is written to the run directory's CLOCK_FILE then.
    A resumed run's clock (`resumed`) goes on from where a run that stopped cleanly left it;
    one that was killed keeps its start: its input was due meanwhile, a backlog."""

    def __init__(self, run_dir: str | None = None, start: float | None = None, elapsed: float = 0.0) -> None:
        self.run_dir = run_dir
        self.start = start
        self.elapsed = elapsed

    @classmethod
    def resumed(cls, run_dir: str) -> SourceClock:
        """The clock of a run that resumes the one in `run_dir`: read before this run writes
        its own run.json there."""
        before = read_json(os.path.join(run_dir, "run.json"))
        summary = read_json(os.path.join(run_dir, "summary.json"))
        if summary.get("run_id") == before.get("run_id") and summary.get("source_clock_s") is not None:
            return cls(run_dir, elapsed=float(summary["source_clock_s"]))
        started = read_json(os.path.join(run_dir, CLOCK_FILE)).get("source_t0")
        return cls(run_dir, start=None if started is None else float(started))

    def t0(self) -> float:
        """The wall time the clock started at (now, the first time it is asked)."""
        if self.start is None:
            self.start = time.time() - self.elapsed
            if self.run_dir is not None:
                with open(os.path.join(self.run_dir, CLOCK_FILE), "w", encoding="utf-8") as f:
                    json.dump({"source_t0": self.start}, f)
        return self.start

    def read(self, now: float) -> float | None:
        """The clock's reading at `now` (None: it never started)."""
        return None if self.start is None else now - self.start


def read_json(path: str) -> dict:
    """The JSON object in `path`; {} when there is none or it holds no object."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}

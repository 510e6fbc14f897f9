"""Fault-tolerance modes: one module each, behind one interface.

A mode has two halves. `Mode` runs in the driver beside the coordinator: it decides what a
lost worker means (fail the run, roll everyone back, recover one worker) and drives any
coordination (checkpoints). `WorkerHooks` runs inside every worker, called by the worker loop
at fixed points:

- `on_start(worker)`: before the first record; `worker.attempt > 0` means a restart;
- `on_batch(op, epoch)`: after a stateful operator processed a batch (its `dirty` keys);
- `on_frontier(op, epoch)`: an operator finished an epoch on all its inputs;
- `on_control(worker, message)`: a coordinator message addressed to the mode;
- `snapshot(op)` / `restore(op, state)`: an operator's state as msgpack-able data;
- `sink_commits_at_frontier`: whether sinks commit as soon as their frontier passes an
  epoch (mode none), or only when the mode says (a checkpoint, a safe point).

Reading `nosync/modes/<name>.py` tells that mode's whole story.
"""

from __future__ import annotations

from typing import Any

from nosync.errors import NosyncError

MODES = ("none", "abs", "nosync", "replay")


class WorkerHooks:
    """The worker half of a mode. The defaults persist nothing."""

    name = "base"
    sink_commits_at_frontier = True
    tracks_dirty = False

    def on_start(self, worker: Any) -> None:
        pass

    def on_batch(self, op: Any, epoch: int) -> None:
        pass

    def on_frontier(self, op: Any, epoch: int) -> None:
        pass

    def on_control(self, worker: Any, message: dict) -> None:
        pass

    def snapshot(self, op: Any) -> Any:
        return dict(op.state) if hasattr(op, "state") else None

    def restore(self, op: Any, state: Any) -> None:
        if hasattr(op, "state"):
            op.state = dict(state)


class Mode:
    """The driver half of a mode."""

    name = "base"

    def worker_hooks(self) -> WorkerHooks:
        return WorkerHooks()

    def on_worker_lost(self, coordinator: Any, worker: int, attempt: int, reason: str) -> None:
        """A worker's control connection dropped or its heartbeats stopped."""
        coordinator.fail(f"worker {worker} (attempt {attempt}) was lost: {reason}")

    def on_worker_registered(self, coordinator: Any, worker: int, attempt: int) -> None:
        """A worker (re)registered; attempt > 0 is a Spark retry of a failed task."""


def get_mode(name: str) -> Mode:
    if name == "none":
        from nosync.modes.none import NoneMode

        return NoneMode()
    if name in MODES:
        raise NosyncError(f"mode '{name}' is not built yet; modes available now: none")
    raise NosyncError(f"unknown mode '{name}'; modes: {', '.join(MODES)}")

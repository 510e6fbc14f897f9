"""Mode `none`: the baseline. Nothing is persisted and nothing recovers.

Sinks commit each epoch as soon as every input of the sink has finished it. When a worker is
lost (its control connection drops, or its heartbeats stop) the run fails at once with a clear
message and exit code 1, and the Spark job is cancelled so that Spark's retry of the task does
not linger. This is the mode every other mode's overhead is measured against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nosync.errors import RunFailed
from nosync.modes.base import Mode
from nosync.runtime.hooks import WorkerHooks

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker


class NoneHooks(WorkerHooks):
    """The worker half of mode none: the defaults, and a restarted worker fails the run."""

    name = "none"

    def on_start(self, worker: Worker, peers: dict) -> None:
        """Fails the run if this worker is a restart (attempt > 0): mode none cannot recover."""
        if worker.attempt > 0:
            raise RunFailed(f"worker {worker.index} restarted (attempt {worker.attempt}); mode none cannot recover")


class NoneMode(Mode):
    """The driver half of mode none: a lost worker fails the run, unless its work was done."""

    name = "none"
    hooks_class = NoneHooks

    def on_worker_lost(self, coordinator: Any, worker: int, attempt: int, reason: str) -> None:
        """Fails the run, unless the lost worker had already finished (its output is committed)."""
        if worker in coordinator.done:
            return  # its work is complete and committed: nothing of the run is lost
        super().on_worker_lost(coordinator, worker, attempt, reason)

    def on_worker_registered(self, coordinator: Any, worker: int, attempt: int) -> None:
        """Fails the run when Spark restarted a worker (attempt > 0)."""
        if attempt > 0:
            coordinator.fail(f"worker {worker} was restarted by Spark (attempt {attempt}); mode none cannot recover")

"""The driver half of a mode (see `nosync.modes` for the whole interface)."""

from __future__ import annotations

from typing import Any

from nosync.options import RunOptions
from nosync.runtime.hooks import WorkerHooks


def workers_metrics(coordinator: Any) -> list[dict]:
    """The mode's metrics of each worker that finished (`WorkerHooks.metrics`, sent in Done)."""
    return [d.get("metrics", {}).get("mode", {}) for d in coordinator.done.values()]


def persist_cpu(per: list[dict], parts: tuple[str, ...]) -> dict[str, float]:
    """The workers' persistence CPU (`persist_cpu_s` of each one's metrics `per`), summed by part."""
    return {part: sum(m.get("persist_cpu_s", {}).get(part, 0.0) for m in per) for part in parts}


def persist_share(coordinator: Any, seconds: float) -> float:
    """`seconds` of the workers' persistence as a share of their time: the longest worker's
    processing time, once per worker that finished (0.0 before any did)."""
    processing = max((float(d.get("seconds", 0.0)) for d in coordinator.done.values()), default=0.0)
    workers = len(coordinator.done)
    return seconds / (processing * workers) if processing and workers else 0.0


class Mode:
    """The driver half of a mode."""

    name = "base"
    hooks_class: type[WorkerHooks] = WorkerHooks
    requires_replayable_sources = False
    """Sources must be able to restart from a position (every source but TcpLines)."""

    def __init__(self, options: RunOptions | None = None, pipeline: str = "") -> None:
        self.options = options or RunOptions()
        self.pipeline = pipeline
        """The name of the pipeline the run runs."""

    def on_worker_lost(self, coordinator: Any, worker: int, attempt: int, reason: str) -> None:
        """A worker's control connection dropped or its heartbeats stopped."""
        coordinator.fail(f"worker {worker} (attempt {attempt}) was lost: {reason}")

    def on_worker_registered(self, coordinator: Any, worker: int, attempt: int) -> None:
        """A worker (re)registered; attempt > 0 is a Spark retry of a failed task."""

    def on_generation(self, coordinator: Any, gen: int) -> dict | None:
        """Every worker joined generation `gen`: what the peers message adds for them. None
        holds the generation back (the workers wait) until the mode calls
        `coordinator.release_generation` (mode replay, while Spark recomputes state)."""
        return {}

    def attach(self, spark: Any, spec: dict) -> None:
        """The run's Spark session and its spec, before the job starts (a mode that runs
        Spark jobs of its own)."""

    def on_rejoin(self, coordinator: Any, worker: int, attempt: int, address: list) -> None:
        """A new attempt of `worker` registered while the others run on in the current
        generation (a mode that recovers one worker alone); the default waits for a regroup."""

    def on_ready(self, coordinator: Any, worker: int, gen: int) -> None:
        """A worker started generation `gen` (restored, connected, about to process)."""

    def on_message(self, coordinator: Any, worker: int, message: dict) -> None:
        """A worker's control message of type "mode"."""

    def tick(self, coordinator: Any) -> None:
        """Called by the coordinator's loop after the messages it took, and about every 50 ms
        when none come (sooner when `due_in` asks)."""

    def due_in(self, coordinator: Any) -> float | None:
        """Seconds until `tick` has something due that no message may come to wake the
        coordinator's loop for (None: nothing sooner than its 50 ms)."""
        return None

    def summary(self, coordinator: Any) -> dict:
        """What the mode adds to the run's summary."""
        return {}

    def tables(self) -> dict[str, list[dict]]:
        """Tables the mode adds to the run directory: file name (without .parquet) -> rows."""
        return {}

    def close(self, coordinator: Any) -> None:
        """The run ended (finished or failed)."""

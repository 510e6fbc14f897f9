"""Fault-tolerance modes: one module each, behind one interface.

A mode has two halves. `Mode` runs in the driver beside the coordinator: it decides what a
lost worker means (fail the run, roll everyone back, recover one worker), drives any
coordination (checkpoints) from `tick`, and reads its workers' messages (`on_message`).
`WorkerHooks` runs inside every worker, called by the worker loop at fixed points:

- `on_start(worker, peers)`: a generation's operators are built, before the first record;
  `peers` is the coordinator's message, with what the driver half added for this generation
  (`Mode.on_generation`: which checkpoint to restore); `worker.attempt > 0` is a restart;
- `on_event(op, channel, event)`: an in-band event (a barrier) reached an operator; the
  default forwards it, a mode may block the channel (`op.block`) to align;
- `on_control(worker, message)`: a coordinator message of type "mode";
- `poll(worker)`: once per loop iteration (durable snapshots are acknowledged here);
- `can_finish(worker)`: whether a worker whose input is exhausted may report done (a mode
  that commits at checkpoints waits for its last commit);
- `sink_commits_at_frontier`: whether sinks commit as soon as their frontier passes an
  epoch (mode none), or only when the mode says (a checkpoint, a safe point);
- `tracks_dirty`: whether keyed operators collect the keys they change (`take_updates`).

Membership is the coordinator's: when a mode calls `coordinator.regroup`, every worker drops
its data connections and joins a new generation (Spark's retry of a lost task joins it too),
and `Mode.on_generation` says what each restores. Reading `nosync/modes/<name>.py` tells that
mode's whole story.
"""

from __future__ import annotations

from nosync.errors import NosyncError
from nosync.modes.abs import AbsMode
from nosync.modes.base import Mode
from nosync.modes.none import NoneMode
from nosync.modes.nosync import NosyncMode
from nosync.modes.replay import ReplayMode
from nosync.options import RunOptions
from nosync.runtime.hooks import WorkerHooks

REGISTRY: dict[str, type[Mode]] = {m.name: m for m in (NoneMode, AbsMode, NosyncMode, ReplayMode)}
"""Every mode by its name: the one place that lists them."""

MODES = tuple(REGISTRY)


def mode_class(name: str) -> type[Mode]:
    """The mode named `name`; an unknown name is a NosyncError that lists the modes."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise NosyncError(f"unknown mode '{name}'; modes: {', '.join(MODES)}") from None


def get_mode(name: str, options: RunOptions | None = None, pipeline: str = "") -> Mode:
    """The driver half of mode `name`, for a run of pipeline `pipeline` with `options`."""
    return mode_class(name)(options, pipeline)


def worker_hooks(name: str, options: RunOptions | None = None) -> WorkerHooks:
    """The worker half of mode `name`, with the run's options."""
    return mode_class(name).hooks_class(options)

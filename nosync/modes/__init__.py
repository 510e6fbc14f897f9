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

from typing import Any

from nosync.errors import NosyncError, RunFailed
from nosync.runtime import frames

MODES = ("none", "abs", "nosync", "replay")


class WorkerHooks:
    """The worker half of a mode. The defaults persist nothing and forward every event."""

    name = "base"
    sink_commits_at_frontier = True
    tracks_dirty = False
    recovers = False
    """Whether a lost peer is survivable: the worker waits to rejoin instead of failing."""
    aligns_epochs = False
    """Whether operators process epochs one after the other (`Op.align_epochs`)."""
    accepts_peers = False
    """Whether a running worker accepts connections from a peer that came back (the peer
    recovers alone; the others never leave their generation)."""

    def __init__(self, options: dict | None = None) -> None:
        self.options = dict(options or {})

    # -- the data path (a mode that numbers and logs frames and steps overrides these) ----

    def send_frame(self, worker: Any, dest: int, kind: int, header: dict, data: bytes) -> None:
        """Sends a data, marker or event frame to worker `dest`; `data` is its body, packed."""
        worker.out[dest].send(frames.encode_packed(kind, header, data))

    def accept_frame(self, worker: Any, source: int, frame: Any) -> bool:
        """Whether a frame that arrived from worker `source` is processed now."""
        return True

    def poll_source(self, worker: Any, source: Any) -> bool:
        """Reads one chunk of `source`; False once it is exhausted."""
        return source.poll()

    def flush_routers(self, worker: Any) -> None:
        """Sends the exchange buffers that waited longer than the linger time."""
        for r in worker.routers:
            r.flush(worker.linger_s)

    def may_read(self, worker: Any) -> bool:
        """Whether sources may be read now (a mode may hold them back: persistence backpressure)."""
        return True

    def on_peer_down(self, worker: Any, peer: int, attempt: int | None = None) -> None:
        """The connections with attempt `attempt` (None: any) of worker `peer`, and with its
        earlier attempts, dropped (modes that recover); a newer attempt's may remain."""

    def on_peer_connected(self, worker: Any, peer: int, conn: Any, direction: str) -> None:
        """A peer that came back opened a connection to this running worker."""

    def on_start(self, worker: Any, peers: dict) -> None:
        pass

    def on_event(self, op: Any, channel: Any, event: dict) -> None:
        op.forward_event(event)

    def on_control(self, worker: Any, message: dict) -> None:
        pass

    def poll(self, worker: Any) -> None:
        pass

    def can_finish(self, worker: Any) -> bool:
        return True

    def metrics(self, worker: Any) -> dict:
        return {}

    def debug_state(self, worker: Any) -> dict:
        """What the mode holds and waits on, for `Worker.dump_state`."""
        return {}

    def close(self, worker: Any) -> None:
        pass


class Mode:
    """The driver half of a mode."""

    name = "base"
    hooks_class: type[WorkerHooks] = WorkerHooks
    requires_replayable_sources = False
    """Sources must be able to restart from a position (every source but TcpLines)."""

    def __init__(self, options: dict | None = None) -> None:
        self.options = dict(options or {})

    def worker_options(self) -> dict:
        """What the worker half needs of this mode's options (msgpack-able)."""
        return dict(self.options)

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
        """Called by the coordinator's loop about every 50 ms."""

    def summary(self, coordinator: Any) -> dict:
        """What the mode adds to the run's summary."""
        return {}

    def tables(self) -> dict[str, list[dict]]:
        """Tables the mode adds to the run directory: file name (without .parquet) -> rows."""
        return {}

    def close(self, coordinator: Any) -> None:
        """The run ended (finished or failed)."""


LOCK_WAIT_S = 30.0
"""How long a restarting worker waits for the store lock of a previous attempt to go."""


def read_store(path: str) -> Any:
    """Opens the `lsm` store at `path` (a run's, or a copy of it) only to read it: its persister
    neither merges its runs (so no retention applies) nor uploads its log to the remote tier."""
    import lsm

    return lsm.Store(path, budget=0, uploads=False)


def open_store(worker: Any, path: str, what: str, **options: Any) -> Any:
    """Opens the `lsm` store at `path` for `worker`, waiting (with heartbeats) while the
    process of an attempt being killed still holds its lock; `what` names it in errors."""
    import time

    import lsm

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return lsm.Store(path, **options)
        except lsm.StoreLockedError as e:
            if time.monotonic() > deadline:
                raise RunFailed(f"worker {worker.index}: {what}: {e}") from e
            worker.keepalive()
            time.sleep(0.1)
        except lsm.LsmError as e:
            raise RunFailed(f"worker {worker.index}: {what}: {e}") from e


def _mode_class(name: str) -> type[Mode]:
    if name == "none":
        from nosync.modes.none import NoneMode

        return NoneMode
    if name == "abs":
        from nosync.modes.abs import AbsMode

        return AbsMode
    if name == "nosync":
        from nosync.modes.nosync import NosyncMode

        return NosyncMode
    if name == "replay":
        from nosync.modes.replay import ReplayMode

        return ReplayMode
    raise NosyncError(f"unknown mode '{name}'; modes: {', '.join(MODES)}")


def get_mode(name: str, options: dict | None = None) -> Mode:
    """The driver half of mode `name`."""
    return _mode_class(name)(options)


def worker_hooks(name: str, options: dict | None = None) -> WorkerHooks:
    """The worker half of mode `name`, with the options its driver half passed on."""
    return _mode_class(name).hooks_class(options)

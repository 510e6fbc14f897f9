"""The hooks through which a mode joins the worker loop (the worker half of a mode; see
`nosync.modes` for the whole interface)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nosync.options import RunOptions
from nosync.runtime import frames

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker


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

    def __init__(self, options: RunOptions | Mapping[str, Any] | None = None) -> None:
        self.options = options if isinstance(options, RunOptions) else RunOptions.from_wire(options)

    # -- the data path (a mode that numbers and logs frames and steps overrides these) ----

    def send_frame(self, worker: Worker, dest: int, kind: int, header: dict, data: bytes) -> None:
        """Sends a data, marker or event frame to worker `dest`; `data` is its body, packed."""
        worker.out[dest].send(frames.encode_packed(kind, header, data))

    def accept_frame(self, worker: Worker, source: int, frame: Any) -> bool:
        """Whether a frame that arrived from worker `source` is processed now."""
        return True

    def poll_source(self, worker: Worker, source: Any) -> bool:
        """Reads one chunk of `source`; False once it is exhausted."""
        return source.poll()

    def may_stop(self, worker: Worker) -> bool:
        """Whether the sources may stop now (`Worker.stop_sources`): once the worker runs its
        restored generation (a mode that replays says no until the replay is done)."""
        return worker.restored and bool(worker.ops)

    def stop_sources(self, worker: Worker, upto: int | None) -> None:
        """Stops the sources at an epoch boundary (a mode that logs its steps logs it first)."""
        worker.stop_sources(upto)

    def flush_routers(self, worker: Worker) -> None:
        """Sends the exchange buffers that waited longer than the linger time."""
        for r in worker.routers:
            r.flush(worker.linger_s)

    def may_read(self, worker: Worker) -> bool:
        """Whether sources may be read now (a mode may hold them back: persistence backpressure)."""
        return True

    def peers_up(self, worker: Worker) -> bool:
        """Whether every peer is up and running with this worker (a mode that recovers a worker
        alone says no while one is away or catching up: the others then read on)."""
        return True

    def on_peer_down(self, worker: Worker, peer: int, attempt: int | None = None) -> None:
        """The connections with attempt `attempt` (None: any) of worker `peer`, and with its
        earlier attempts, dropped (modes that recover); a newer attempt's may remain."""

    def on_peer_connected(self, worker: Worker, peer: int, conn: Any, direction: str) -> None:
        """A peer that came back opened a connection to this running worker."""

    def on_start(self, worker: Worker, peers: dict) -> None:
        """A generation's operators are built, before the first record: the mode restores them
        (`peers`: the coordinator's message); the default restores nothing."""
        pass

    def on_event(self, op: Any, channel: Any, event: dict) -> None:
        """An in-band event reached operator `op` on `channel`; the default forwards it."""
        op.forward_event(event)

    def on_control(self, worker: Worker, message: dict) -> None:
        """A coordinator message of type "mode" arrived; the default ignores it."""
        pass

    def poll(self, worker: Worker) -> None:
        """Runs once per loop iteration (durable snapshots are acknowledged here);
        the default does nothing."""
        pass

    def idle(self, worker: Worker, wait: float) -> float:
        """Runs when the loop has nothing to read, before it waits up to `wait` seconds for
        input: a mode may use the time (a restored state loading in parts) and say how long
        the loop may still wait. The default does nothing and waits."""
        return wait

    def can_finish(self, worker: Worker) -> bool:
        """Whether a worker whose input is exhausted may report done; the default: at once."""
        return True

    def metrics(self, worker: Worker) -> dict:
        """The mode's metrics of this worker (under "mode" in `Worker.metrics`); the default has
        none."""
        return {}

    def debug_state(self, worker: Worker) -> dict:
        """What the mode holds and waits on, for `Worker.dump_state`."""
        return {}

    def close(self, worker: Worker) -> None:
        """The worker is ending: releases what the mode holds; the default holds nothing."""
        pass

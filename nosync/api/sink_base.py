"""The base of every sink: `Sink` (what a pipeline names) and `SinkPart` (one worker's
writer, staging per epoch); see `nosync.api.sinks` for the commit protocol."""

from __future__ import annotations

import inspect
from typing import Any


class Sink:
    """Base of all sinks: `open_part` gives the per-worker writer."""

    def open_part(self, worker: int, run_id: str, local_dir: str | None = None) -> SinkPart:
        """The writer of worker `worker` in run `run_id`. `local_dir`: a directory on the
        worker's own host where the part may keep files while they are not committed (None:
        one under the system's temporary directory)."""
        raise NotImplementedError

    def check_writable(self) -> None:
        """Raises NosyncError naming the sink unless it can write where it is told to (called
        before a run starts, so that a bad place fails it before the first epoch). The base has
        nothing to check."""

    def describe(self) -> str:
        """A short description of the sink, for messages (the base: its class name)."""
        return type(self).__name__


def open_part_of(sink: Sink, worker: int, run_id: str, local_dir: str) -> SinkPart:
    """`sink.open_part(worker, run_id, local_dir=local_dir)`, or without `local_dir` for a sink
    whose `open_part` was written before it took one (a user's subclass)."""
    try:
        takes = "local_dir" in inspect.signature(sink.open_part).parameters
    except (TypeError, ValueError):
        takes = False
    return sink.open_part(worker, run_id, local_dir=local_dir) if takes else sink.open_part(worker, run_id)


ALL = 1 << 62
"""Every epoch (a pre-commit of everything staged)."""


class SinkPart:
    """One worker's writer: write() stages, commit(epoch) publishes, close() ends.

    The base stages records per epoch in memory; `take(epoch)` hands a commit the staged
    epochs up to `epoch`, oldest first."""

    order_matters = True
    """Whether the committed output depends on the order of the records of an epoch (a
    LevelDB sink: the last write of a key wins); a multiset of records per epoch does not."""

    def __init__(self) -> None:
        self.pending: dict[int, list] = {}
        self.held: dict[int, list] = {}
        self.replace = False
        """Whether a commit of an epoch first takes back what this worker committed of that
        epoch before (mode replay commits an epoch again after recomputing it). A part that
        keeps no per-epoch output, or cannot take it back, ignores it."""

    def write(self, epoch: int, records: list) -> None:
        """Stages `records` under `epoch`."""
        self.pending.setdefault(epoch, []).extend(records)

    def take(self, epoch: int) -> list[tuple[int, list]]:
        """Takes the staged epochs <= `epoch` out: (epoch, records) pairs, oldest first."""
        due = sorted(e for e in self.pending if e <= epoch)
        return [(e, self.pending.pop(e)) for e in due]

    def commit(self, epoch: int) -> int:
        """Publishes everything staged for epochs <= `epoch`; returns how many records."""
        raise NotImplementedError

    def has_staged(self, upto: int = ALL) -> bool:
        """Whether records of epochs <= `upto` are staged."""
        return any(v for e, v in self.pending.items() if e <= upto)

    def seal(self, epoch: int) -> None:
        """No record of epochs <= `epoch` will come: a part may finish writing them early."""

    def precommit(self, checkpoint: int, upto: int = ALL, durable: bool = True) -> Any:
        """Moves what is staged for epochs <= `upto` (default: everything) into the pre-commit
        of `checkpoint`; returns its handle (msgpack-able). Without `durable`, the pre-commit
        need not survive a crash (its writer can produce it again: mode nosync's lineage points)
        and is cheaper; `harden` makes it durable later. The base keeps it in memory: never
        durable across a crash."""
        self.held[checkpoint] = self.take(upto)
        return sum(len(r) for _, r in self.held[checkpoint])

    def harden(self, checkpoint: int, handle: Any) -> Any:
        """Makes a pre-commit made without `durable` survive a crash; returns its new handle."""
        return handle

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        """Publishes the pre-commit of `checkpoint`; returns how many records."""
        due = self.held.pop(checkpoint, [])
        for e, recs in due:
            self.pending.setdefault(e, []).extend(recs)
        return self.commit(1 << 62)

    def sync(self) -> None:
        """Makes the commits made so far survive a crash of the machine, not only of the
        process (a commit need not: this is called before a snapshot or checkpoint records
        them, and before the worker reports its output done). The base has nothing to sync."""

    def recover(self, checkpoint: int, handles: list, retract_above: int | None = None) -> int:
        """Back to `checkpoint`: commits `handles` ((checkpoint, handle) pairs, all <= it),
        drops everything else staged, and takes back output committed under a checkpoint above
        `retract_above` (default: `checkpoint`); returns how many records it committed."""
        self.abort()
        return 0

    def abort(self) -> None:
        """Drops what is staged and not committed."""
        self.pending.clear()
        self.held = {}

    def close(self) -> None:
        """Releases what the part holds open; the base holds nothing."""
        pass

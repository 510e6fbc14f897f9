"""The source operator: reads this worker's partitions of one source, epoch by epoch, from
exact positions, paced when the source is (`Source.due`), and stops at an epoch boundary when
the run is stopped."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nosync.errors import BadRecord, RunFailed
from nosync.runtime.operators import EOS, Op

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker


class SourceOp(Op):
    """Reads this worker's partitions of one source, epoch by epoch, round robin.

    A partition's position names exactly the next record to read: `[offset, skip]`, where
    `offset` is where `source.read` starts the chunk being consumed and `skip` counts the
    records of it already emitted. Every source reads the same chunks again from the same
    offset, so a restart from a position emits exactly the records after it.
    """

    def __init__(self, node: Any, parts: list[dict], worker: Worker) -> None:
        super().__init__(node)
        self.source = node.params["source"]
        self.w = worker
        self.parts = [
            {"part": p, "iter": None, "offset": None, "skip": 0, "chunk": None, "next": None, "read": 0, "done": False}
            for p in parts
        ]
        self.epoch = 0
        self.started = time.monotonic()
        self.finished = False
        self.stopped = False
        """Whether the run is stopping and this source read its last record of the run
        (`stop`); unlike `finished`, a snapshot does not keep it: a resumed run reads on."""
        self._mute = False
        due = getattr(self.source, "due", None)
        self._due = due if parts and due is not None and due(parts[0], 0) is not None else None
        """The source's pace (`Source.due`), None for a source read as fast as the run can."""
        self.t0 = getattr(worker, "spec", {}).get("source_t0") or time.time()
        """The wall time the run's source clock started at (a paced source's record j of a
        partition is due t0 + j / rate)."""

    def _on_bad(self, bad: BadRecord) -> None:
        if not self._mute:
            self.w.dead_letter(self.name, bad)

    def _next_chunk(self, st: dict, limit: int) -> list:
        """Up to `limit` records of the partition, from its position on."""
        chunk = st["chunk"]
        while chunk is None or st["skip"] >= len(chunk):
            drop = 0
            if chunk is not None:
                # consumed whole: the next chunk starts where this one said
                st["offset"], st["skip"], st["chunk"] = st["next"], 0, None
            if st["iter"] is None:
                # (re)opened at a position: the records of its first chunk already emitted go
                st["iter"] = self.source.read(st["part"], st["offset"], self.w.batch_size, self._on_bad)
                drop = st["skip"]
            # a chunk read again from a position inside it was read whole before: its bad
            # records went to the dead letters then
            self._mute = drop > 0
            try:
                recs, st["next"] = next(st["iter"])
            except StopIteration:
                st["done"] = True
                return []
            finally:
                self._mute = False
            chunk = st["chunk"] = recs
            st["skip"] = drop
        i = st["skip"]
        recs = chunk[i : i + limit]
        st["skip"] = i + len(recs)
        return recs

    def _eligible(self) -> tuple[dict, int] | None:
        """The partition the next poll reads from (the first not done with room left in the
        epoch) and the most records it may read, None when the next poll closes the epoch or
        finishes."""
        w = self.w
        for st in self.parts:
            if st["done"]:
                continue
            if w.epoch_ms:
                return st, w.batch_size
            room = (self.epoch + 1) * w.epoch_records - st["read"]
            if room > 0:
                return st, min(w.batch_size, room)
        return None

    def due_at(self) -> float:
        """The wall time from which the next poll reads a record or closes an epoch (0: now).
        A paced source's chunk is read once its last record is due, so that a poll reads the
        same records whenever it happens: a replay of the logged polls reads what they read."""
        if self._due is None or self.finished:
            return 0.0
        if self.w.epoch_ms and self.time_epoch() > self.epoch:
            return 0.0
        found = self._eligible()
        if found is None:
            return 0.0
        st = found[0]
        chunk = st["chunk"]
        if chunk is not None and st["skip"] < len(chunk):
            return 0.0
        start = int((st["next"] if chunk is not None else st["offset"]) or 0)
        return self.t0 + self._due(st["part"], start + self.w.batch_size - 1)

    def time_epoch(self) -> int:
        """The epoch the clock says (sources cut by --epoch-ms)."""
        return int((time.monotonic() - self.started) * 1000 // self.w.epoch_ms)

    def poll(self, now_epoch: int | None = None) -> bool:
        """Reads and pushes one chunk; returns False once the source is exhausted. With
        --epoch-ms, `now_epoch` is the clock's epoch to use (a replay repeats the one logged)."""
        if self.finished:
            return False
        w = self.w
        if w.epoch_ms:
            e = self.time_epoch() if now_epoch is None else now_epoch
            if e > self.epoch:
                self._close_epoch(e - 1)
                self.epoch = e
        # a partition that turns out done is passed over for the next one
        while (found := self._eligible()) is not None:
            st, limit = found
            recs = self._next_chunk(st, limit)
            if recs:
                st["read"] += len(recs)
                if self._due is None:
                    w.clock.ts = time.time()
                else:
                    # event time: when the batch's middle record was due
                    mid = int(st["offset"] or 0) + st["skip"] - (len(recs) + 1) // 2
                    w.clock.ts = self.t0 + self._due(st["part"], mid)
                if w.first_read_at is None:
                    w.first_read_at = time.time()
                self.records_in += len(recs)
                self.emit(recs, self.epoch)
                if w.slow_s:
                    time.sleep(w.slow_s)
                return True
            if not st["done"]:
                return True
        if all(st["done"] for st in self.parts):
            self.finished = True
            self._close_epoch(EOS)
            return False
        if not w.epoch_ms:
            self._close_epoch(self.epoch)
            self.epoch += 1
        return True

    def stop(self, upto: int | None) -> None:
        """The run stops: the source reads no more, and its epoch being read is closed (the
        next one starts the resumed run); with `upto`, every epoch up to it is closed too, so
        that every worker ends at the same boundary. A finished source has nothing to do."""
        if self.finished:
            return
        if not self.stopped:
            self.stopped = True
            self._close_epoch(self.epoch)
            self.epoch += 1
        if upto is not None and upto >= self.epoch:
            self._close_epoch(upto)
            self.epoch = upto + 1

    @property
    def last_closed(self) -> int:
        """The last epoch this source closed (-1: none yet)."""
        return self.epoch - 1

    def _close_epoch(self, epoch: int) -> None:
        self.frontier = epoch
        for _, mark, _, chan in self.targets:
            mark(chan, epoch, None, epoch == EOS)

    def snapshot_meta(self) -> dict:
        """Adds the source's epoch, whether it finished, the records read and
        each partition's position."""
        return {
            **super().snapshot_meta(),
            "epoch": self.epoch,
            "finished": self.finished,
            "records_in": self.records_in,
            "parts": [[st["offset"], st["skip"], st["read"], st["done"]] for st in self.parts],
        }

    def restore_meta(self, meta: dict) -> None:
        """Restores the epoch and every partition's position, read again from there; a checkpoint of
        another number of partitions fails the run."""
        super().restore_meta(meta)
        self.epoch = meta["epoch"]
        self.finished = meta["finished"]
        self.records_in = meta["records_in"]
        if len(meta["parts"]) != len(self.parts):
            raise RunFailed(
                f"source '{self.name}': the checkpoint has {len(meta['parts'])} partitions on this worker, "
                f"the pipeline now has {len(self.parts)}"
            )
        for st, (offset, skip, read, done) in zip(self.parts, meta["parts"], strict=True):
            st.update(offset=offset, skip=skip, read=read, done=done, iter=None, chunk=None, next=None)
        if self.w.epoch_ms:
            # the clock's epochs go on from the restored one, not from 0
            self.started = time.monotonic() - self.epoch * self.w.epoch_ms / 1000


class Stop:
    """A worker's part in a stop of the run (`nosync.driver.stopping`): what the coordinator
    asked (`asked`) and what this generation's sources did (`done`), each False (nothing), None
    (stop reading) or the epoch to close every source up to; and the epoch the sinks' frontier
    must pass for the worker to be done (`end_epoch`: EOS unless the run stops)."""

    __slots__ = ("asked", "done", "end_epoch")

    def __init__(self) -> None:
        self.asked: int | None | bool = False
        self.done: int | None | bool = False
        self.end_epoch = EOS

    def ask(self, upto: int | None) -> None:
        """The coordinator's `Stop(upto)`: kept if it asks more than was asked before."""
        if _further(upto, self.asked):
            self.asked = upto

    @property
    def pending(self) -> bool:
        """Whether the sources have yet to do what was asked."""
        return _further(self.asked, self.done)

    def new_generation(self) -> None:
        """New sources read until told to stop again (a replay stops them where the log says)."""
        self.done, self.end_epoch = False, EOS

    def carry_out(self, sources: list, upto: int | None) -> None:
        """Every source stops reading at the end of its epoch, and with `upto`, closes every
        epoch up to it; the worker is then done once its sinks passed that boundary."""
        for s in sources:
            s.stop(upto)
        if upto is None:
            if self.done is False:
                self.done = None
        else:
            self.end_epoch = self.done = upto

    def report(self, sources: list) -> dict:
        """What a heartbeat says of it: where the sources stopped (the last epoch closed) and
        the boundary they were closed up to."""
        if self.done is False:
            return {}
        return {"stopped": [max((s.last_closed for s in sources), default=-1), self.done]}


def _further(stop: int | None | bool, than: int | None | bool) -> bool:
    """Whether stop request `stop` asks more than `than` (as `Stop.asked`)."""
    if stop is False:
        return False
    if than is False:
        return True
    return stop is not None and (than is None or stop > than)

"""Runtime operators: one instance of each logical operator on every worker.

Operators work on batches: `push(records, epoch, channel)` processes a list and emits lists to
the operator's targets; nothing is done per record that a batch could do once. Progress flows
beside the data as markers: `marker(channel, epoch, wm, eos)` says that every record of epochs
<= epoch has arrived on that channel. An operator's frontier is the least epoch completed on all
its inputs; when it advances, `on_frontier` runs (a window closes, a sink commits) and the
operator forwards its own marker. Markers carry a watermark `wm` (the greatest event time seen
before them; None before any), which windows use to close.

In-band events (a checkpoint barrier) travel the same edges in order with the records:
`event(channel, ev)` hands one to the mode (`hooks.on_event`), which may block the channel
(`block`): until it is unblocked, what arrives on that channel is held in arrival order, never
dropped, and replayed by `unblock`. This is how ABS aligns; no other mode blocks.

An operator emits its outputs with the greatest epoch it has seen (`last_epoch`), not the
epoch of the batch that caused them: inputs from several workers may be at different epochs,
and committing epoch by epoch must never reorder what one instance emitted for a key.

State of keyed operators lives in a plain dict per operator (`state`). Everything a restart
needs (keyed state, window bookkeeping, frontiers and watermarks, sink staging) is taken by
`snapshot_meta` (small, msgpack-able) and `take_updates` (the keyed updates since the last
call: new values, TOMBSTONE for deleted keys), and put back by `restore_meta` and
`restore_keyed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lsm.keys import check_keys
from nosync.api.pipeline import Node
from nosync.errors import RunFailed
from nosync.runtime.histogram import Histogram

if TYPE_CHECKING:
    pass

EOS = 1 << 62
"""The epoch of a finished channel."""

Target = tuple[
    Callable[[list, int, Any], None], Callable[[Any, int, Any, bool], None], Callable[[Any, dict], None], Any
]


class Op:
    """Base: input bookkeeping, frontier tracking, emission, metrics."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.name = node.name
        self.targets: list[Target] = []
        self.inputs: dict[Any, int] = {}
        self.input_wm: dict[Any, Any] = {}
        self.frontier = -1
        self.last_epoch = -1
        self.records_in = 0
        self.records_out = 0
        self.busy_s = 0.0
        self.hooks: Any = None
        self.blocked: set = set()
        self.held: list = []
        self.held_records = 0
        self.track_dirty = False
        self.align_epochs = False
        """Epoch by epoch (mode replay): a channel that finished epoch e is blocked until every
        input has, so the instance processes no record of e + 1 before the last of e."""
        self.loader: Callable[[Any], Any] | None = None
        """Keyed operators restored lazily: key -> saved value (or MISSING_STATE)."""

    def connect(self, push: Callable, marker: Callable, channel: Any, event: Callable | None = None) -> None:
        """Sends this operator's output to (push, marker, event), tagged with `channel`."""
        self.targets.append((push, marker, event or _ignore_event, channel))

    def add_input(self, channel: Any) -> None:
        """Declares the input `channel`: no epoch finished on it yet, no watermark."""
        self.inputs[channel] = -1
        self.input_wm[channel] = None

    def emit(self, records: list, epoch: int) -> None:
        """Pushes `records` to every target, tagged with `epoch`."""
        if records:
            self.records_out += len(records)
            for push, _, _, chan in self.targets:
                push(records, epoch, chan)

    # -- in-band events and blocked channels -------------------------------------------

    def event(self, channel: Any, ev: dict) -> None:
        """An in-band event (a barrier) arrived on `channel`, after every record sent before it."""
        if self.blocked and channel in self.blocked:
            self.held.append((2, channel, ev, None))
            return
        self.hooks.on_event(self, channel, ev)

    def forward_event(self, ev: dict) -> None:
        """Sends an in-band event on to every target."""
        for _, _, event, chan in self.targets:
            event(chan, ev)

    def block(self, channel: Any) -> None:
        """Holds back everything that arrives on `channel` until `unblock`."""
        self.blocked.add(channel)

    def unblock(self) -> None:
        """Unblocks every channel and replays what was held, in arrival order (a replayed
        event may block a channel again: what follows it on that channel is held anew)."""
        self.blocked.clear()
        held, self.held = self.held, []
        self.held_records = 0
        self._replay_held(held)

    def release(self, channels: set) -> None:
        """Unblocks `channels` and replays what was held for them, in arrival order; what is
        held for the other channels stays held."""
        self.blocked -= channels
        go = [h for h in self.held if h[1] in channels]
        self.held = [h for h in self.held if h[1] not in channels]
        self.held_records = sum(len(h[2]) for h in self.held if h[0] == 0)
        self._replay_held(go)

    def _replay_held(self, held: list) -> None:
        for kind, channel, a, b in held:
            if kind == 0:
                self.push(a, b, channel)
            elif kind == 1:
                self.marker(channel, a[0], a[1], b)
            else:
                self.event(channel, a)

    # -- records and progress ----------------------------------------------------------

    def push(self, records: list, epoch: int, channel: Any) -> None:
        """A batch arrived on `channel`: processes it (held while the channel is blocked) and emits
        the output with `last_epoch`; an error in user code fails the run."""
        if self.blocked and channel in self.blocked:
            self.held.append((0, channel, records, epoch))
            self.held_records += len(records)
            return
        t = time.perf_counter()
        if self.loader is not None:
            self.fault_in(records)
        self.records_in += len(records)
        if epoch > self.last_epoch:
            self.last_epoch = epoch
        try:
            out = self.process(records, epoch, channel)
        except RunFailed:
            raise
        except Exception as e:
            raise RunFailed(
                f"operator '{self.name}' (declared at {self.node.where}) raised {type(e).__name__}: {e}"
            ) from e
        if self.track_dirty:
            self.note_changes(records, out)
        self.busy_s += time.perf_counter() - t
        if out:
            self.emit(out, self.last_epoch)

    def process(self, records: list, epoch: int, channel: Any) -> list | None:
        """The output of a batch (None: nothing); the base passes the records through."""
        return records

    def note_changes(self, records: list, out: list | None) -> None:
        """With `track_dirty`: what processing `records` changed (keyed operators)."""

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
        """Every record of epochs <= `epoch` arrived on `channel` (all of them with `eos`): when the
        frontier moves, runs `on_frontier` and forwards the marker."""
        if self.blocked and channel in self.blocked:
            self.held.append((1, channel, (epoch, wm), eos))
            return
        inputs = self.inputs
        if epoch <= inputs[channel] and not eos:
            return
        inputs[channel] = EOS if eos else epoch
        if wm is not None:
            prev = self.input_wm[channel]
            self.input_wm[channel] = wm if prev is None or wm > prev else prev
        f = min(inputs.values())
        if f > self.frontier:
            if f != EOS:
                self.last_epoch = max(self.last_epoch, f)
            self.frontier = f
            t = time.perf_counter()
            out_wm = self.watermark()
            self.on_frontier(f, out_wm)
            self.busy_s += time.perf_counter() - t
            for _, mark, _, chan in self.targets:
                mark(chan, f, out_wm, f == EOS)
        if self.align_epochs:
            if self.blocked:
                ready = {c for c in self.blocked if inputs[c] <= self.frontier}
                if ready:
                    self.release(ready)
            if inputs[channel] > self.frontier and channel not in self.blocked:
                self.block(channel)

    def watermark(self) -> Any:
        """The least watermark of the inputs; None while any input has none."""
        wms = list(self.input_wm.values())
        if not wms or any(w is None for w in wms):
            return None
        return min(wms)

    def on_frontier(self, epoch: int, wm: Any) -> None:
        """Every input has finished `epoch` (EOS: everything)."""

    def metrics(self) -> dict:
        """Records in and out, and the seconds spent processing."""
        return {"records_in": self.records_in, "records_out": self.records_out, "busy_s": self.busy_s}

    # -- state ---------------------------------------------------------------------

    def snapshot_meta(self) -> dict:
        """What a restart needs besides keyed state: frontiers and watermarks."""
        return {
            "inputs": dict(self.inputs),
            "wm": dict(self.input_wm),
            "frontier": self.frontier,
            "last_epoch": self.last_epoch,
        }

    def restore_meta(self, meta: dict) -> None:
        """Puts back what `snapshot_meta` took (channels this instance no longer has are skipped)."""
        for chan, e in meta["inputs"].items():
            if chan in self.inputs:
                self.inputs[chan] = e
        for chan, wm in meta["wm"].items():
            if chan in self.input_wm:
                self.input_wm[chan] = wm
        self.frontier = meta["frontier"]
        self.last_epoch = meta["last_epoch"]


class MapOp(Op):
    """Map: each record r becomes fn(r)."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """fn of each record, in order."""
        return list(map(self.node.params["fn"], records))


class FlatMapOp(Op):
    """Flat map: each record r becomes the records fn(r) returns."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """The records fn returns for each record, in order."""
        fn = self.node.params["fn"]
        out: list = []
        ext = out.extend
        for r in records:
            ext(fn(r))
        return out


class FilterOp(Op):
    """Filter: the records r for which fn(r) is true."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """The records of the batch for which fn is true, in order."""
        return list(filter(self.node.params["fn"], records))


class KeyByOp(Op):
    """Keys are checked here, once per batch, against what the state store accepts (None, int,
    str, bytes, tuples of them): a key that routing would take but no mode could save fails the
    run naming this operator, in every mode alike."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """(fn(r), r) for each record r; a key the state store cannot hold raises KeyEncodingError."""
        fn = self.node.params["fn"]
        out = [(fn(r), r) for r in records]
        check_keys(out)
        return out


class UnionOp(Op):
    """Union: the records of every input, passed on as they come."""

    pass


class Clock:
    """The ingest time of the batch being processed (for end-to-end latency): when it was
    read, or when it was due for a paced source."""

    __slots__ = ("ts",)

    def __init__(self) -> None:
        self.ts = 0.0


class SinkOp(Op):
    """Stages records in the worker's sink part and commits them as the mode says: mode none
    commits each epoch once its frontier passes it (`commit`); a checkpointing mode
    pre-commits at a barrier (`precommit`: the staged output made durable outside the
    committed output) and commits once the checkpoint completes (`commit_checkpoint`).
    A pre-commit is committed only while `fence` lets it (the worker's lease, `Links.fence`):
    a replaced attempt that wakes leaves its pre-commits to its replacement."""

    def __init__(self, node: Node, part: Any, clock: Any) -> None:
        super().__init__(node)
        self.fence: Callable[[], str | None] | None = None
        self.deferred = False
        """Whether the fence held back the last commit that had something ready: the mode
        tries again (`commit_ready`), as its grant was."""
        self.part = part
        self.clock = clock
        self.committed = 0
        self.staged_ts: dict[int, list[tuple[float, int]]] = {}
        self.precommitted: list[tuple[int, Any]] = []
        self.precommit_ts: dict[int, list[tuple[float, int]]] = {}
        self.latency = Histogram()
        """Ingest to commit of every record committed (fixed size, whatever the run's length)."""
        self.measure_from = 0.0
        """Latency counts the records ingested (or due) from this wall time on (a benchmark's
        steady window)."""
        self.last_commit_at: float | None = None
        self.committed_epoch = -1

    def process(self, records: list, epoch: int, channel: Any) -> None:
        """Stages the batch in the sink part under `epoch`; a batch of an epoch already
        committed fails the run."""
        if epoch <= self.committed_epoch:
            raise RunFailed(f"sink '{self.name}' got {len(records)} records of epoch {epoch} after committing it")
        self.part.write(epoch, records)
        self.staged_ts.setdefault(epoch, []).append((self.clock.ts, len(records)))
        return None

    def _committed(self, n: int, stamps: list[tuple[float, int]]) -> None:
        self.committed += n
        now = time.time()
        if n:
            self.last_commit_at = now
        for ts, count in stamps:
            if ts and ts >= self.measure_from:
                self.latency.record(now - ts, count)

    def commit(self, epoch: int) -> None:
        """Publishes every epoch <= `epoch` (mode none)."""
        n = self.part.commit(epoch)
        self.committed_epoch = max(self.committed_epoch, epoch)
        stamps = []
        for e in [e for e in self.staged_ts if e <= epoch]:
            stamps.extend(self.staged_ts.pop(e))
        self._committed(n, stamps)

    def precommit(self, checkpoint: int, upto: int | None = None, durable: bool = True) -> None:
        """Makes what is staged for epochs <= `upto` (None: everything) the pre-commit of
        `checkpoint`, outside the committed output; durable across a crash unless `durable` is
        False (`harden` makes it so later)."""
        if upto is None:
            handle = self.part.precommit(checkpoint, durable=durable)
            stamps = [x for s in self.staged_ts.values() for x in s]
            self.staged_ts.clear()
        else:
            handle = self.part.precommit(checkpoint, upto, durable=durable)
            stamps = [x for e in [e for e in self.staged_ts if e <= upto] for x in self.staged_ts.pop(e)]
        self.precommitted.append((checkpoint, handle))
        self.precommit_ts[checkpoint] = stamps

    def harden(self) -> None:
        """Makes every pre-commit not yet committed durable across a crash."""
        self.precommitted = [(c, self.part.harden(c, h)) for c, h in self.precommitted]

    def commit_checkpoint(self, checkpoint: int) -> None:
        """Publishes what was pre-committed under checkpoints <= `checkpoint` (the pre-commits
        are in the order of their checkpoints)."""
        self.commit_ready(lambda c: c <= checkpoint)

    def commit_ready(self, ready: Callable[[int], bool]) -> list[int]:
        """Publishes the pre-commits whose checkpoint `ready` accepts, oldest first, and returns
        their checkpoints. When the order of records matters to the part (`order_matters`), none
        passes one still waiting; otherwise each goes as soon as it is ready."""
        done: list[int] = []
        self.deferred = False
        for c, handle in list(self.precommitted):
            if not ready(c):
                if self.part.order_matters:
                    break
                continue
            if not done and self.fence is not None and self.fence() is not None:
                self.deferred = True  # counted by the fence, reported if this attempt learns it was replaced
                break
            self.precommitted.remove((c, handle))
            n = self.part.commit_precommit(c, handle)
            self._committed(n, self.precommit_ts.pop(c, []))
            done.append(c)
        return done

    @property
    def uncommitted(self) -> bool:
        """Whether anything staged or pre-committed is not yet committed."""
        return bool(self.precommitted) or self.part.has_staged()

    def on_frontier(self, epoch: int, wm: Any) -> None:
        """Commits the epochs the frontier passed (mode none), or seals them in the
        part when the mode commits."""
        if self.hooks is None or self.hooks.sink_commits_at_frontier:
            self.commit(epoch)
        else:
            self.part.seal(epoch)

    def metrics(self) -> dict:
        """The operator's metrics, with the records committed."""
        m = super().metrics()
        m["committed"] = self.committed
        return m

    def snapshot_meta(self) -> dict:
        """Adds the count of records committed and the pre-commits not yet committed; the
        commits it counts are synced first (`SinkPart.sync`)."""
        self.part.sync()
        return {**super().snapshot_meta(), "committed": self.committed, "precommitted": list(self.precommitted)}

    def restore_meta(self, meta: dict) -> None:
        """Back to the state of a checkpoint: its pre-commits are committed (idempotently:
        a commit repeated after a crash writes nothing twice), staging of later checkpoints
        is discarded."""
        super().restore_meta(meta)
        self.committed = meta["committed"]

    def recover(self, checkpoint: int, precommitted: list, retract_above: int | None = None) -> None:
        """Back to `checkpoint` through the part's `recover`: commits `precommitted` ((checkpoint,
        handle) pairs), drops the rest, and counts what it committed."""
        self.precommitted = [(c, h) for c, h in precommitted]
        n = self.part.recover(checkpoint, self.precommitted, retract_above)
        self.precommitted = []
        self.committed += n


def _ignore_event(channel: Any, ev: dict) -> None:
    pass

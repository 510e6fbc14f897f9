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
from itertools import repeat
from operator import itemgetter
from typing import Any

import msgpack

from lsm import TOMBSTONE, Updates
from lsm.keys import check_keys, encode_key
from nosync.api.pipeline import Node
from nosync.errors import PipelineError, RunFailed
from nosync.runtime import statecodec

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
        self.inputs[channel] = -1
        self.input_wm[channel] = None

    def emit(self, records: list, epoch: int) -> None:
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
        return records

    def note_changes(self, records: list, out: list | None) -> None:
        """With `track_dirty`: what processing `records` changed (keyed operators)."""

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
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
        wms = list(self.input_wm.values())
        if not wms or any(w is None for w in wms):
            return None
        return min(wms)

    def on_frontier(self, epoch: int, wm: Any) -> None:
        """Every input has finished `epoch` (EOS: everything)."""

    def metrics(self) -> dict:
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
        for chan, e in meta["inputs"].items():
            if chan in self.inputs:
                self.inputs[chan] = e
        for chan, wm in meta["wm"].items():
            if chan in self.input_wm:
                self.input_wm[chan] = wm
        self.frontier = meta["frontier"]
        self.last_epoch = meta["last_epoch"]


class MapOp(Op):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        return list(map(self.node.params["fn"], records))


class FlatMapOp(Op):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        fn = self.node.params["fn"]
        out: list = []
        ext = out.extend
        for r in records:
            ext(fn(r))
        return out


class FilterOp(Op):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        return list(filter(self.node.params["fn"], records))


class KeyByOp(Op):
    """Keys are checked here, once per batch, against what the state store accepts (None, int,
    str, bytes, tuples of them): a key that routing would take but no mode could save fails the
    run naming this operator, in every mode alike."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        fn = self.node.params["fn"]
        out = [(fn(r), r) for r in records]
        check_keys(out)
        return out


class UnionOp(Op):
    pass


class KeyedOp(Op):
    """Base of operators with per-key state (a dict); with `track_dirty`, `dirty` collects the
    keys that processing changed, for modes that persist updates."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.state: dict = {}
        self.dirty: set = set()
        self.pairs: list = []
        """Updates logged as they were made (operators whose output is each key's new state),
        packed: (n, msgpack array of n [key, value] pairs) per batch."""

    def note_changes(self, records: list, out: list | None) -> None:
        self.dirty.update([r[0] for r in records])

    def take_updates(self) -> Updates:
        """The keyed updates since the last call, and forgets them: the batches of updates
        logged as they were made (`pairs`), then a key column and a value column of the other
        keys changed (TOMBSTONE for a deleted key), gathered by one C pass. The values are the
        live objects: the caller copies them (the store packs them) before the next record is
        processed. Every key passed `KeyByOp`'s check (`checked`)."""
        keys = list(self.dirty)
        self.dirty = set()
        pairs, self.pairs = self.pairs, []
        return Updates(keys, list(map(self.state.get, keys, repeat(TOMBSTONE))), pairs, True)

    def forget_updates(self) -> None:
        self.dirty = set()
        self.pairs = []

    def state_error(self, e: Exception) -> RunFailed:
        """The error of a snapshot whose state cannot be saved (`lsm.ValueEncodingError`),
        naming this operator, the key and the type."""
        key = getattr(e, "key", None)
        cause = getattr(e, "cause", e)
        return RunFailed(
            f"operator '{self.name}' (declared at {self.node.where}): the state of key {key!r:.60} "
            f"cannot be saved: {cause}"
        )

    def restore_state(self, state: dict) -> None:
        """Takes `state` (a store's `load`: key -> value) as this instance's keyed state."""
        self.state = state

    def saved_state(self) -> list:
        """Every key's value, saved as `take_updates` saves it."""
        save = self._save
        scalar = _SCALARS
        return [(k, v if type(v) in scalar else save(k, v)) for k, v in self.state.items()]

    def check_saved(self, keys: int) -> None:
        """Saves the state of the `keys` keys this instance took on last, as a snapshot would,
        and drops the bytes: raises RunFailed naming the operator, the key and the type when
        one cannot be saved. For modes that save state only when recovering."""
        state = self.state
        scalar = _SCALARS
        for n, k in enumerate(reversed(state)):
            if n >= keys:
                break
            v = state[k]
            if type(v) not in scalar:
                self._save(k, v)

    def _save(self, k: Any, v: Any) -> bytes:
        try:
            return statecodec.pack(v)
        except TypeError as e:
            raise RunFailed(
                f"operator '{self.name}' (declared at {self.node.where}): the state of key {k!r:.60} "
                f"cannot be saved: {e}"
            ) from None

    def lazy(self, loader: Callable[[Any], Any], raw: bool = False) -> None:
        """Restores lazily: a key's saved value is loaded by `loader(key)` (MISSING_STATE when
        it has none) the first time a record touches it, so a restore costs nothing up front.
        With `raw`, the loader returns the state itself, not a saved value."""
        self.loader = loader
        self.looked: set = set()
        self.raw_state = raw

    def fault_in(self, records: list) -> None:
        state = self.state
        looked = self.looked
        load = self.loader
        unpack = statecodec.unpack
        for r in records:
            k = r[0]
            if k in state or k in looked:
                continue
            looked.add(k)
            v = load(k)
            if v is not MISSING_STATE:
                state[k] = unpack(v) if type(v) is bytes and not self.raw_state else v

    def restore_keyed(self, items: Any, keepalive: Callable[[], None] = lambda: None) -> None:
        """Loads (key, saved value) pairs written by `take_updates`."""
        state = self.state
        unpack = statecodec.unpack
        for i, (k, v) in enumerate(items):
            state[k] = unpack(v) if type(v) is bytes else v
            if i & 0x3FFF == 0:
                keepalive()

    def metrics(self) -> dict:
        m = super().metrics()
        m["keys"] = len(self.state)
        return m


class _LogsOutput(KeyedOp):
    """An operator whose output is, record by record, (key, the key's new state): its updates
    are logged as it emits them, packed while they are at hand, so that a snapshot gathers
    nothing. A batch whose states are not plain msgpack values (a tuple or another container
    whose type must come back) is noted as changed keys instead.

    When keys repeat within an interval, the changed keys are the smaller record: once an
    interval logged more than twice as many updates as the operator has keys, the next ones
    note changed keys (a snapshot writes each once, with its value then); once fewer than
    half the updates noted were of keys not noted before, they are logged again. Either way a
    snapshot's run holds the pairs logged, then the changed keys, the latter winning."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.by_keys = False
        """Whether updates are noted as changed keys rather than logged as pairs."""
        self._noted = 0

    def note_changes(self, records: list, out: list | None) -> None:
        if not out:
            return
        self._noted += len(out)
        if not self.by_keys and set(map(type, map(_second, out))) <= _PLAIN:
            try:
                self.pairs.append((len(out), _PAIRS.pack(out)))
                return
            except (OverflowError, ValueError, TypeError):
                _PAIRS.reset()
        self.dirty.update(map(_first, out))

    def take_updates(self) -> Updates:
        logged = sum(n for n, _ in self.pairs)
        noted, self._noted = self._noted, 0
        u = super().take_updates()
        if not noted:
            return u
        if not self.by_keys:
            self.by_keys = logged > 2 * len(self.state)
        else:
            self.by_keys = 2 * len(u.keys) <= noted
        return u

    def forget_updates(self) -> None:
        super().forget_updates()
        self._noted = 0


class ReduceOp(_LogsOutput):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        fn = self.node.params["fn"]
        state = self.state
        get = state.get
        out = []
        append = out.append
        missing = _MISSING
        for k, v in records:
            acc = get(k, missing)
            acc = v if acc is missing else fn(acc, v)
            state[k] = acc
            append((k, acc))
        return out


class AggregateOp(_LogsOutput):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        init = self.node.params["init"]
        add = self.node.params["add"]
        state = self.state
        get = state.get
        out = []
        append = out.append
        missing = _MISSING
        for k, v in records:
            acc = get(k, missing)
            if acc is missing:
                acc = init()
            acc = add(acc, v)
            state[k] = acc
            append((k, acc))
        return out


class StatefulMapOp(KeyedOp):
    def process(self, records: list, epoch: int, channel: Any) -> list:
        fn = self.node.params["fn"]
        state = self.state
        out: list = []
        ext = out.extend
        for k, v in records:
            new, outputs = fn(state.get(k), v)
            if new is None:
                state.pop(k, None)
            else:
                state[k] = new
            ext(outputs)
        return out


class WindowOp(KeyedOp):
    """Tumbling event-time windows; state[key] = {window start: acc}. A window closes when
    the watermark reaches its end; a record for a window already closed is late: counted in
    `late`, and dropped."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.seen_max: dict = {}
        self.closed_before = None
        self.late = 0

    def process(self, records: list, epoch: int, channel: Any) -> None:
        p = self.node.params
        size, timef, init, add = p["size"], p["time"], p["init"], p["add"]
        state = self.state
        closed = self.closed_before
        top = self.seen_max.get(channel)
        for k, v in records:
            t = timef(v)
            if top is None or t > top:
                top = t
            start = (t // size) * size
            if closed is not None and start + size <= closed:
                self.late += 1
                continue
            wins = state.get(k)
            if wins is None:
                wins = state[k] = {}
            acc = wins.get(start, _MISSING)
            wins[start] = add(init() if acc is _MISSING else acc, v)
        self.seen_max[channel] = top
        return None

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
        top = self.seen_max.get(channel)
        if top is not None:
            prev = self.input_wm.get(channel)
            if prev is None or top > prev:
                self.input_wm[channel] = top
        super().marker(channel, epoch, None, eos)

    def watermark(self) -> Any:
        if self.frontier == EOS:
            return None
        return super().watermark()

    def on_frontier(self, epoch: int, wm: Any) -> None:
        size = self.node.params["size"]
        out = []
        final = epoch == EOS
        if not final and wm is None:
            return
        dirty = self.dirty if self.track_dirty else None
        # in key order, not arrival order: a restored instance emits the same output
        for k in sorted(self.state, key=encode_key):
            wins = self.state[k]
            closing = [start for start in sorted(wins) if final or start + size <= wm]
            if not closing:
                continue
            for start in closing:
                out.append((k, (start, wins.pop(start))))
            if not wins:
                del self.state[k]
            if dirty is not None:
                dirty.add(k)
        if not final:
            self.closed_before = wm if self.closed_before is None else max(self.closed_before, wm)
        if out:
            # at the end of input, what closes belongs to an epoch after every one seen, which
            # no sink downstream can have committed yet
            self.emit(out, self.last_epoch + 1 if final else epoch)
        return None

    def metrics(self) -> dict:
        m = super().metrics()
        m["late"] = self.late
        return m

    def snapshot_meta(self) -> dict:
        return {
            **super().snapshot_meta(),
            "seen_max": dict(self.seen_max),
            "closed_before": self.closed_before,
            "late": self.late,
        }

    def restore_meta(self, meta: dict) -> None:
        super().restore_meta(meta)
        self.seen_max = {c: t for c, t in meta["seen_max"].items() if c in self.inputs}
        self.closed_before = meta["closed_before"]
        self.late = meta["late"]


class JoinOp(KeyedOp):
    """Symmetric hash join: state[key] = ([left values], [right values])."""

    def __init__(self, node: Node, left_channels: set) -> None:
        super().__init__(node)
        self.left_channels = left_channels
        self.incremental = False
        """Collect what each batch appended (`take_increments`) instead of dirty keys: the
        sides only grow, so a mode that logs state writes the new values, not the sides."""
        self.appended: list = []

    def process(self, records: list, epoch: int, channel: Any) -> list:
        state = self.state
        left = channel in self.left_channels
        side = 0 if left else 1
        log = self.appended if self.incremental else None
        out = []
        for k, v in records:
            sides = state.get(k)
            if sides is None:
                sides = state[k] = ([], [])
            mine = sides[side]
            mine.append(v)
            if log is not None:
                log.append((k, side, len(mine) - 1, v))
            if left:
                out.extend((k, (v, r)) for r in sides[1])
            else:
                out.extend((k, (lv, v)) for lv in sides[0])
        return out

    def take_increments(self) -> tuple[list, list]:
        """The values appended since the last call, as a key column of (key, side, index) and a
        value column; forgets them. The sides only grow, so a mode that logs state writes the
        new values, not the sides."""
        appended, self.appended = self.appended, []
        return [(k, side, i) for k, side, i, _ in appended], [v for *_, v in appended]

    def restore_increments(self, increments: dict) -> None:
        """Rebuilds the sides from logged increments ((key, side, index) -> value)."""
        state: dict = {}
        for (k, side, _), v in sorted(increments.items(), key=lambda kv: kv[0][2]):
            sides = state.get(k)
            if sides is None:
                sides = state[k] = ([], [])
            sides[side].append(v)
        self.state = state


class IterateOp(Op):
    """Runs the loop body on a batch until no record is kept (bounded by max_iterations)."""

    def __init__(self, node: Node, body: list[Op]) -> None:
        super().__init__(node)
        self.body = body
        self._collected: list = []
        self.iterations = 0

    def wire(self, entry: Op, exit_op: Op) -> None:
        self.entry = entry
        exit_op.connect(self._collect, lambda *a: None, "loop")

    def _collect(self, records: list, epoch: int, channel: Any) -> None:
        self._collected.extend(records)

    def process(self, records: list, epoch: int, channel: Any) -> list:
        keep = self.node.params["keep"]
        limit = self.node.params["max_iterations"]
        out: list = []
        pending = records
        rounds = 0
        while pending:
            rounds += 1
            if rounds > limit:
                raise RunFailed(
                    f"operator '{self.name}' (declared at {self.node.where}): {len(pending)} records "
                    f"still looping after max_iterations={limit}"
                )
            self._collected = []
            self.entry.push(pending, epoch, "loop")
            pending = []
            for r in self._collected:
                (pending if keep(r) else out).append(r)
        self.iterations += rounds
        return out


class SinkOp(Op):
    """Stages records in the worker's sink part and commits them as the mode says: mode none
    commits each epoch once its frontier passes it (`commit`); a checkpointing mode
    pre-commits at a barrier (`precommit`: the staged output made durable outside the
    committed output) and commits once the checkpoint completes (`commit_checkpoint`)."""

    def __init__(self, node: Node, part: Any, clock: Any) -> None:
        super().__init__(node)
        self.part = part
        self.clock = clock
        self.committed = 0
        self.staged_ts: dict[int, list[tuple[float, int]]] = {}
        self.precommitted: list[tuple[int, Any]] = []
        self.precommit_ts: dict[int, list[tuple[float, int]]] = {}
        self.latencies: list[tuple[float, int]] = []
        self.last_commit_at: float | None = None
        self.committed_epoch = -1

    def process(self, records: list, epoch: int, channel: Any) -> None:
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
            if ts:
                self.latencies.append((now - ts, count))

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
        """Publishes what was pre-committed under checkpoints <= `checkpoint`."""
        while self.precommitted and self.precommitted[0][0] <= checkpoint:
            c, handle = self.precommitted.pop(0)
            n = self.part.commit_precommit(c, handle)
            self._committed(n, self.precommit_ts.pop(c, []))

    @property
    def uncommitted(self) -> bool:
        return bool(self.precommitted) or self.part.has_staged()

    def on_frontier(self, epoch: int, wm: Any) -> None:
        if self.hooks is None or self.hooks.sink_commits_at_frontier:
            self.commit(epoch)
        else:
            self.part.seal(epoch)

    def metrics(self) -> dict:
        m = super().metrics()
        m["committed"] = self.committed
        return m

    def snapshot_meta(self) -> dict:
        return {**super().snapshot_meta(), "committed": self.committed, "precommitted": list(self.precommitted)}

    def restore_meta(self, meta: dict) -> None:
        """Back to the state of a checkpoint: its pre-commits are committed (idempotently:
        a commit repeated after a crash writes nothing twice), staging of later checkpoints
        is discarded."""
        super().restore_meta(meta)
        self.committed = meta["committed"]

    def recover(self, checkpoint: int, precommitted: list, retract_above: int | None = None) -> None:
        self.precommitted = [(c, h) for c, h in precommitted]
        n = self.part.recover(checkpoint, self.precommitted, retract_above)
        self.precommitted = []
        self.committed += n


_MISSING = object()
MISSING_STATE = object()
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
"""Values plain msgpack gives back as they were."""
_PAIRS = msgpack.Packer(use_bin_type=True)
_first = itemgetter(0)
_second = itemgetter(1)
"""What a lazy loader returns for a key without saved state."""
_SCALARS = frozenset({int, float, str, bool, type(None)})


def _ignore_event(channel: Any, ev: dict) -> None:
    pass


OPS: dict[str, type[Op]] = {
    "map": MapOp,
    "flat_map": FlatMapOp,
    "filter": FilterOp,
    "key_by": KeyByOp,
    "union": UnionOp,
    "loop_entry": Op,
    "reduce": ReduceOp,
    "aggregate": AggregateOp,
    "stateful_map": StatefulMapOp,
    "window": WindowOp,
}


def make_op(node: Node) -> Op:
    cls = OPS.get(node.kind)
    if cls is None:
        raise PipelineError(f"no runtime operator for kind {node.kind!r}", node.name, node.where)
    return cls(node)

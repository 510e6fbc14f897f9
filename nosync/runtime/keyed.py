"""Keyed operators: reduce, aggregate, stateful map, windows and joins, each holding its state
in a plain dict, collecting the keys it changes for a mode that persists them.

See `nosync.runtime.operators` for batches, markers, frontiers and events."""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from typing import Any

import msgpack

from lsm import TOMBSTONE, Updates
from lsm.keys import encode_key
from nosync import codec
from nosync.api.pipeline import Node
from nosync.errors import RunFailed
from nosync.runtime.operators import EOS, Op

_MISSING = object()
MISSING_STATE = object()
"""What a lazy loader returns for a key without saved state."""
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
"""Values plain msgpack gives back as they were."""
_PAIRS = msgpack.Packer(use_bin_type=True)
_first = itemgetter(0)
_second = itemgetter(1)
FULL_AFTER = 1.0
"""An operator that logs its updates writes its whole state at a snapshot, not its changes,
once the updates logged since it last did outnumber its keys by this factor: about as many
bytes, and a restore then reads one run of the state, not every run since the last merge."""
FULL_MAX_KEYS = 1_000_000
"""A state of more keys is never taken whole: one run of millions of keys is packed on the
processing thread in one call (seconds), passes `--max-unpersisted-mb` (the sources wait for
it), and a key read alone from it decodes it whole; its changes, merged by size tiers, cost
less."""
_SCALARS = frozenset({int, float, str, bool, type(None)})


class KeyedOp(Op):
    """Base of operators with per-key state (a dict); with `track_dirty`, `dirty` collects the
    keys that processing changed, for modes that persist updates."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.state: dict = {}
        self.dirty: set = set()
        self.pairs: list = []
        """Updates logged as they were made (operators whose output is each key's new state),
        packed: (n, msgpack map of the n (key, value) pairs in their order, a later pair of a
        key the newer) per batch."""

    def note_changes(self, records: list, out: list | None) -> None:
        """Notes the keys of `records` as changed."""
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
        """Drops the updates collected since the last `take_updates`, unsaved."""
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
            return codec.pack_state(v)
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
        """Loads, through the lazy loader (`lazy`), the saved state of the keys of
        `records` not looked up before."""
        state = self.state
        looked = self.looked
        load = self.loader
        unpack = codec.unpack_state
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
        unpack = codec.unpack_state
        for i, (k, v) in enumerate(items):
            state[k] = unpack(v) if type(v) is bytes else v
            if i & 0x3FFF == 0:
                keepalive()

    def metrics(self) -> dict:
        """The operator's metrics, with the number of keys it holds."""
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
    snapshot's run holds the pairs logged, then the changed keys, the latter winning.

    Once the updates since the state was last taken whole outnumber its keys (FULL_AFTER), and
    it holds at most FULL_MAX_KEYS, the next snapshot takes it whole instead (`take_full`: one
    run of every live key, which a restore reads alone), and the updates until then are not
    noted at all: processing a record then costs nothing here. So does the next interval's,
    when the one before had more updates than keys. That holds from the start, and after a restore once the state was
    taken whole again: until then the updates are noted as changed keys meanwhile, in case it
    cannot be (a restore still loading it). Should it not be after all, every key counts as
    changed, once (these operators never delete a key), and updates are noted again until a
    take of the whole state succeeds. The state taken whole is a key column and a value
    column, which the store packs as it packs changed keys: values of any type it stores
    (tuples, lists, sets...) come back as they were, so no value needs looking at first."""

    full_after = FULL_AFTER
    """FULL_AFTER for this operator (math.inf: never taken whole)."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.by_keys = False
        """Whether updates are noted as changed keys rather than logged as pairs."""
        self._noted = 0
        self._since_full = 0
        """Updates logged or noted since the state was last taken whole (`take_full`)."""
        self.full_due = False
        """Whether the next snapshot takes the whole state: the updates after it are not packed;
        they are noted as changed keys (in case the state cannot be taken whole) unless a take
        succeeded before (`_whole_ok`), and then not noted at all."""
        self._whole_ok = True
        """Whether the last try to take the state whole succeeded, or none was made since the
        start (not since a restore: `forget_updates`). Only then are the updates not noted while
        the next one is due."""

    def note_changes(self, records: list, out: list | None) -> None:
        if not out:
            return
        self._noted += len(out)
        self._since_full += len(out)
        n = len(self.state)
        if not self.full_due and self._since_full > self.full_after * n and n <= FULL_MAX_KEYS:
            self.full_due = True
        if self.full_due and self._whole_ok:
            # the next snapshot takes the state whole: nothing to note per record meanwhile
            # (should it not, every key counts as changed)
            return
        plain = not self.by_keys and set(map(type, map(_second, out))) <= _PLAIN
        if plain and not self.full_due:
            try:
                # a map, not an array of pairs: half the packing, and decoded straight into a dict
                self.pairs.append((len(out), _PAIRS.pack_map_pairs(out)))
                return
            except (OverflowError, ValueError, TypeError):
                _PAIRS.reset()
        self.dirty.update(map(_first, out))

    def take_full(self) -> Updates | None:
        """The whole state as one run of every live key (`Updates(full=True)`): its key
        column and its value column (the live values: the store packs each column in one
        call before the next record is processed), forgetting the updates collected; None,
        and nothing forgotten, when the state is not all here (a restore still loading it:
        the keys not loaded yet are live too).

        When the interval just ended had more updates than the state has keys, the next
        snapshot takes the state whole too, and the updates until then are not noted at all."""
        state = self.state
        if self.loader is not None:
            return None
        again = self._noted > self.full_after * len(state)
        self.dirty = set()
        self.pairs = []
        self._noted = self._since_full = 0
        self.full_due = again
        self._whole_ok = True
        return Updates(list(state), list(state.values()), [], True, full=True)

    def take_updates(self) -> Updates:
        if self.full_due and self._whole_ok and not self._since_full:
            return Updates([], [], [], True)  # no update since the state was taken whole
        if self.full_due:
            full = self.take_full()
            if full is not None:
                return full
            if self._whole_ok:
                # the updates since full_due were not noted: every key counts as changed
                self.dirty = set(self.state)
            self.full_due = False
            self._whole_ok = False
            self._since_full = 0
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
        self._whole_ok = False


class ReduceOp(_LogsOutput):
    """A running reduction per key: state[key] = fn(acc, value), emitted as
    (key, acc) for every record."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """Folds each record's value into its key's accumulator (the first value starts it) and
        emits (key, accumulator)."""
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
    """A running aggregate per key, begun by `init()` and grown by `add(acc, value)`, emitted as
    (key, acc) for every record."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """Adds each record's value to its key's aggregate (begun by `init()`) and emits
        the key with its aggregate."""
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
    """A map with state per key: fn(state, value) gives the key's new state (None deletes it)
    and the records to emit."""

    def process(self, records: list, epoch: int, channel: Any) -> list:
        """Calls fn(state, value) for each record, keeps the new state (None: deletes the key) and
        emits the records it returns."""
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
        """Adds each record to its key's window by event time and notes the greatest event time of
        the channel; a record of a closed window is counted late and dropped. Emits nothing."""
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
        """Passes the marker on with the greatest event time seen on `channel` as the channel's
        watermark, not the marker's own."""
        top = self.seen_max.get(channel)
        if top is not None:
            prev = self.input_wm.get(channel)
            if prev is None or top > prev:
                self.input_wm[channel] = top
        super().marker(channel, epoch, None, eos)

    def watermark(self) -> Any:
        """The least watermark of the inputs (None while any input has none); None
        once every input has ended."""
        if self.frontier == EOS:
            return None
        return super().watermark()

    def on_frontier(self, epoch: int, wm: Any) -> None:
        """Emits the windows the watermark has passed (every window at end of input), in key order,
        and drops them from the state."""
        size = self.node.params["size"]
        out = []
        final = epoch == EOS
        if not final and (wm is None or self.node.params.get("loop_internal")):
            # inside a loop, markers carry the loop's progress, not event time: windows close
            # at the end of input
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
        """The operator's metrics, with the count of late records."""
        m = super().metrics()
        m["late"] = self.late
        return m

    def snapshot_meta(self) -> dict:
        """Adds the window bookkeeping: the greatest event time per channel, the bound below which
        windows closed, the late count."""
        return {
            **super().snapshot_meta(),
            "seen_max": dict(self.seen_max),
            "closed_before": self.closed_before,
            "late": self.late,
        }

    def restore_meta(self, meta: dict) -> None:
        """Restores the window bookkeeping too (event times only of the channels this instance has)."""
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
        """Adds each record to its key's side and emits it paired with every value of the other side
        so far, as (key, (left, right))."""
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

"""Runtime operators: one instance of each logical operator on every worker.

Operators work on batches: `push(records, epoch, channel)` processes a list and emits lists to
the operator's targets; nothing is done per record that a batch could do once. Progress flows
beside the data as markers: `marker(channel, epoch, wm, eos)` says that every record of epochs
<= epoch has arrived on that channel. An operator's frontier is the least epoch completed on all
its inputs; when it advances, `on_frontier` runs (a window closes, a sink commits) and the
operator forwards its own marker. Markers carry a watermark `wm` (the greatest event time seen
before them; None before any), which windows use to close.

State of keyed operators lives in a plain dict per operator (`state`); a fault-tolerance mode
reads and restores it through the hooks in `nosync.modes`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nosync.errors import PipelineError, RunFailed
from nosync.pipeline import Node

EOS = 1 << 62
"""The epoch of a finished channel."""

Target = tuple[Callable[[list, int, Any], None], Callable[[Any, int, Any, bool], None], Any]


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

    def connect(self, push: Callable, marker: Callable, channel: Any) -> None:
        """Sends this operator's output to (push, marker), tagged with `channel`."""
        self.targets.append((push, marker, channel))

    def add_input(self, channel: Any) -> None:
        self.inputs[channel] = -1
        self.input_wm[channel] = None

    def emit(self, records: list, epoch: int) -> None:
        if records:
            self.records_out += len(records)
            for push, _, chan in self.targets:
                push(records, epoch, chan)

    def push(self, records: list, epoch: int, channel: Any) -> None:
        t = time.perf_counter()
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
        self.busy_s += time.perf_counter() - t
        if out:
            self.emit(out, epoch)

    def process(self, records: list, epoch: int, channel: Any) -> list | None:
        return records

    def marker(self, channel: Any, epoch: int, wm: Any, eos: bool) -> None:
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
            for _, mark, chan in self.targets:
                mark(chan, f, out_wm, f == EOS)

    def watermark(self) -> Any:
        wms = list(self.input_wm.values())
        if not wms or any(w is None for w in wms):
            return None
        return min(wms)

    def on_frontier(self, epoch: int, wm: Any) -> None:
        """Every input has finished `epoch` (EOS: everything)."""

    def metrics(self) -> dict:
        return {"records_in": self.records_in, "records_out": self.records_out, "busy_s": self.busy_s}


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
    def process(self, records: list, epoch: int, channel: Any) -> list:
        fn = self.node.params["fn"]
        return [(fn(r), r) for r in records]


class UnionOp(Op):
    pass


class KeyedOp(Op):
    """Base of operators with per-key state (a dict); `dirty` collects the keys a batch
    changed, for modes that persist updates."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.state: dict = {}
        self.track_dirty = False
        self.dirty: set = set()

    def push(self, records: list, epoch: int, channel: Any) -> None:
        super().push(records, epoch, channel)
        if self.track_dirty:
            self.dirty.update(k for k, _ in records)

    def metrics(self) -> dict:
        m = super().metrics()
        m["keys"] = len(self.state)
        return m


class ReduceOp(KeyedOp):
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


class AggregateOp(KeyedOp):
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
        for k in list(self.state):
            wins = self.state[k]
            for start in sorted(wins):
                if final or start + size <= wm:
                    out.append((k, (start, wins.pop(start))))
            if not wins:
                del self.state[k]
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


class JoinOp(KeyedOp):
    """Symmetric hash join: state[key] = ([left values], [right values])."""

    def __init__(self, node: Node, left_channels: set) -> None:
        super().__init__(node)
        self.left_channels = left_channels

    def process(self, records: list, epoch: int, channel: Any) -> list:
        state = self.state
        left = channel in self.left_channels
        out = []
        for k, v in records:
            sides = state.get(k)
            if sides is None:
                sides = state[k] = ([], [])
            if left:
                sides[0].append(v)
                out.extend((k, (v, r)) for r in sides[1])
            else:
                sides[1].append(v)
                out.extend((k, (lv, v)) for lv in sides[0])
        return out


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
    """Stages records in the worker's sink part; commits per the mode's policy (for `none`,
    when the frontier passes an epoch)."""

    def __init__(self, node: Node, part: Any, clock: Any) -> None:
        super().__init__(node)
        self.part = part
        self.clock = clock
        self.committed = 0
        self.staged_ts: dict[int, list[tuple[float, int]]] = {}
        self.latencies: list[tuple[float, int]] = []
        self.last_commit_at: float | None = None
        self.committed_epoch = -1

    def process(self, records: list, epoch: int, channel: Any) -> None:
        if epoch <= self.committed_epoch:
            raise RunFailed(f"sink '{self.name}' got {len(records)} records of epoch {epoch} after committing it")
        self.part.write(epoch, records)
        self.staged_ts.setdefault(epoch, []).append((self.clock.ts, len(records)))
        return None

    def commit(self, epoch: int) -> None:
        n = self.part.commit(epoch)
        self.committed_epoch = max(self.committed_epoch, epoch)
        self.committed += n
        now = time.time()
        if n:
            self.last_commit_at = now
        for e in [e for e in self.staged_ts if e <= epoch]:
            for ts, count in self.staged_ts.pop(e):
                if ts:
                    self.latencies.append((now - ts, count))

    def on_frontier(self, epoch: int, wm: Any) -> None:
        if self.hooks is None or self.hooks.sink_commits_at_frontier:
            self.commit(epoch)

    def metrics(self) -> dict:
        m = super().metrics()
        m["committed"] = self.committed
        return m


_MISSING = object()

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

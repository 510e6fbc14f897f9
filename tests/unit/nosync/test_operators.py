"""Runtime operators driven directly: batches and markers in, batches and markers out.

Operators come from nodes of real pipelines (`make_op`, or the classes the worker builds itself
for join and iterate, wired as nosync/runtime/worker.py's `_build` wires them). A `Collector`
(tests/support/operators.py) stands in for the downstream operator. Expected outputs come from
plain-Python models.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.operators import Collector, source, wire

import nosync as ns
from nosync.api.plan import plan
from nosync.errors import PipelineError, RunFailed
from nosync.runtime import loops
from nosync.runtime.graph import connect_back_edge, finish_loops, make_op
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.keyed import JoinOp
from nosync.runtime.loops import LoopHead, LoopTail
from nosync.runtime.operators import EOS, SinkOp
from nosync.runtime.worker import Worker

SETTINGS = settings(max_examples=80, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
THIS_FILE = __file__


def next_line() -> int:
    """The line number just after the caller's line."""
    return inspect.currentframe().f_back.f_lineno + 1


def run_op(stream: ns.Stream, inputs=("in",)):
    op = make_op(stream.node)
    return op, wire(op, inputs)


batches_of_ints = st.lists(st.lists(st.integers(-50, 50), max_size=8), max_size=8)
keyed_batches = st.lists(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-20, 20)), max_size=8), max_size=8)


# -- stateless operators ---------------------------------------------------------------------


@SETTINGS
@given(batches=batches_of_ints)
def test_map_flat_map_filter_key_by(batches):
    p = ns.Pipeline("p")
    s = source(p)
    cases = [
        (s.map(lambda x: x * 3 + 1), lambda x: [x * 3 + 1]),
        (s.flat_map(lambda x: [x] * (x % 3)), lambda x: [x] * (x % 3)),
        (s.flat_map(lambda x: (str(i) for i in range(x % 2))), lambda x: [str(i) for i in range(x % 2)]),
        (s.filter(lambda x: x % 2 == 0), lambda x: [x] if x % 2 == 0 else []),
        (s.key_by(lambda x: x % 5), lambda x: [(x % 5, x)]),
    ]
    for stream, model in cases:
        op, out = run_op(stream)
        for epoch, batch in enumerate(batches):
            op.push(batch, epoch, "in")
        # one output batch per input batch that produced something, with its epoch
        expected = [(out_b, e) for e, b in enumerate(batches) if (out_b := [y for x in b for y in model(x)])]
        assert out.batches == expected, stream.node.kind
        assert op.records_in == sum(map(len, batches))
        assert op.records_out == sum(len(b) for b, _ in expected)


def test_make_op_refuses_kinds_the_worker_builds_itself():
    p = ns.Pipeline("p")
    a = source(p).key_by(str)
    j = a.join(source(p).key_by(str), name="j")
    with pytest.raises(PipelineError, match="no runtime operator"):
        make_op(j.node)


# -- keyed running state ---------------------------------------------------------------------


@SETTINGS
@given(batches=keyed_batches)
def test_aggregate_and_reduce_running_values(batches):
    p = ns.Pipeline("p")
    k = source(p).key_by(lambda kv: kv)
    agg, agg_out = run_op(k.aggregate(lambda: 100, lambda acc, v: acc * 2 - v))
    red, red_out = run_op(k.reduce(lambda acc, v: acc - v))
    model_agg: dict = {}
    model_red: dict = {}
    expected_agg, expected_red = [], []
    for epoch, batch in enumerate(batches):
        agg.push(batch, epoch, "in")
        red.push(batch, epoch, "in")
        for key, v in batch:
            model_agg[key] = model_agg.get(key, 100) * 2 - v
            expected_agg.append((key, model_agg[key]))
            model_red[key] = model_red[key] - v if key in model_red else v
            expected_red.append((key, model_red[key]))
    assert agg_out.records == expected_agg
    assert red_out.records == expected_red
    assert agg.state == model_agg
    assert red.state == model_red


def test_reduce_first_value_is_the_accumulator_even_if_falsy():
    p = ns.Pipeline("p")
    red, out = run_op(source(p).key_by(str).reduce(lambda a, b: a + b))
    red.push([("k", 0), ("k", 0), ("j", None)], 0, "in")
    assert out.records == [("k", 0), ("k", 0), ("j", None)]


@SETTINGS
@given(batches=keyed_batches)
def test_stateful_map_forgets_a_key_when_state_is_none(batches):
    def count_to_three(state, v):
        n = (state or 0) + 1
        if n == 3:
            return None, [("reset", v)]
        return n, [("n", n)] * (v % 2)

    p = ns.Pipeline("p")
    op, out = run_op(source(p).key_by(str).stateful_map(count_to_three))
    model: dict = {}
    expected = []
    for epoch, batch in enumerate(batches):
        op.push(batch, epoch, "in")
        for key, v in batch:
            n = model.pop(key, 0) + 1
            if n == 3:
                expected.append(("reset", v))
            else:
                model[key] = n
                expected.extend([("n", n)] * (v % 2))
        assert op.state == model  # a forgotten key is gone from the state, not None
    assert out.records == expected


# -- window ----------------------------------------------------------------------------------


def window_op(size: float = 10.0, inputs=("in",)):
    p = ns.Pipeline("p")
    w = source(p).key_by(lambda r: r[0]).window(size, lambda r: r[1], list, lambda acc, r: [*acc, r[1]])
    return run_op(w, inputs)


def test_window_closes_at_the_watermark_and_flushes_at_eos():
    op, out = window_op(10.0)
    op.push([("a", ("a", 1)), ("a", ("a", 5)), ("b", ("b", 12)), ("a", ("a", 15))], 0, "in")
    assert out.batches == []  # nothing before the frontier marker
    op.marker("in", 0, None, False)
    # the watermark is 15, the greatest time seen: [0, 10) of a closes, nothing else
    assert out.batches == [([("a", (0, [1, 5]))], 0)]
    assert out.markers == [(0, 15, False)]

    op.push([("a", ("a", 3)), ("a", ("a", 19))], 1, "in")  # a@3 is late: [0, 10) closed
    assert op.late == 1
    op.marker("in", 1, None, False)  # watermark 19 closes nothing ([10, 20) ends at 20)
    assert out.batches == [([("a", (0, [1, 5]))], 0)]

    op.push([("b", ("b", 25))], 2, "in")
    op.marker("in", 2, None, False)  # watermark 25
    assert out.batches[1:] == [([("a", (10, [15, 19])), ("b", (10, [12]))], 2)]

    op.marker("in", 2, None, True)  # end of input: everything left, in a fresh epoch
    assert out.batches[2:] == [([("b", (20, [25]))], 3)]
    assert out.markers[-1] == (EOS, None, True)
    assert op.state == {}
    assert op.metrics()["late"] == 1


def test_window_record_of_a_window_that_closed_exactly_at_the_watermark_is_late():
    op, out = window_op(10.0)
    op.push([("a", ("a", 2)), ("a", ("a", 10))], 0, "in")
    op.marker("in", 0, None, False)  # watermark 10 = the end of [0, 10): it closes
    assert out.batches == [([("a", (0, [2]))], 0)]
    op.push([("a", ("a", 9)), ("a", ("a", 10))], 1, "in")  # 9 is late, 10 is not
    assert op.late == 1
    op.marker("in", 1, None, True)
    assert out.batches[1:] == [([("a", (10, [10, 10]))], 2)]


def test_window_waits_for_every_input():
    op, out = window_op(10.0, inputs=("x", "y"))
    op.push([("a", ("a", 30))], 0, "x")
    op.marker("x", 0, None, False)
    op.marker("y", 0, None, False)  # y has seen nothing: no watermark, nothing closes
    assert out.batches == []
    assert out.markers == [(0, None, False)]
    op.push([("a", ("a", 11))], 1, "y")
    op.marker("x", 1, None, False)
    op.marker("y", 1, None, False)  # watermark min(30, 11) = 11: [0, 10) would close; empty
    assert out.batches == []
    op.push([("a", ("a", 21))], 2, "y")
    op.marker("x", 2, None, False)
    op.marker("y", 2, None, False)  # watermark 21 closes [10, 20)
    assert out.batches == [([("a", (10, [11]))], 2)]
    op.marker("x", 3, None, True)
    op.marker("y", 3, None, True)
    assert out.batches[1:] == [([("a", (20, [21])), ("a", (30, [30]))], 3)]


@SETTINGS
@given(
    epochs=st.lists(
        st.lists(st.tuples(st.sampled_from("xy"), st.sampled_from("ab"), st.integers(0, 12)), max_size=6),
        max_size=6,
    ),
    size=st.sampled_from([1, 3, 5]),
    data=st.data(),
)
def test_window_model(epochs, size, data):
    """Two channels, event times non-decreasing per channel (so nothing is late): each window
    is emitted once, complete, at the first epoch whose watermark (the least over channels of
    the greatest time each has seen) reaches its end, or at EOS."""
    clock = {"x": 0, "y": 0}
    timed = []  # [(channel, key, time)] per epoch, with per-channel non-decreasing times
    for batch in epochs:
        recs = []
        for ch, key, step in batch:
            clock[ch] += step
            recs.append((ch, key, clock[ch]))
        timed.append(recs)
    op, out = window_op(float(size), inputs=("x", "y"))
    seen: dict[str, int] = {}
    windows: dict = collections.defaultdict(list)  # (key, start) -> times
    expected: dict = {}  # (key, start) -> emitting epoch
    for epoch, recs in enumerate(timed):
        for ch, key, t in recs:
            op.push([(key, (key, t))], epoch, ch)
            seen[ch] = max(seen.get(ch, t), t)
            windows[(key, (t // size) * size)].append(t)
        for ch in data.draw(st.permutations(["x", "y"])):
            op.marker(ch, epoch, None, False)
        if len(seen) == 2:
            wm = min(seen.values())
            for w in windows:
                if w not in expected and w[1] + size <= wm:
                    expected[w] = epoch
    op.marker("x", len(timed), None, True)
    op.marker("y", len(timed), None, True)
    last = len(timed)  # frontier epochs reached 0..len-1, then EOS: a fresh epoch
    for w in windows:
        expected.setdefault(w, last)
    got = {}
    for recs, epoch in out.batches:
        for key, (start, acc) in recs:
            assert (key, start) not in got, "window emitted twice"
            got[(key, start)] = (epoch, acc)
    assert got == {w: (expected[w], windows[w]) for w in windows}
    assert op.late == 0


# -- join ------------------------------------------------------------------------------------


def join_op() -> tuple[JoinOp, Collector]:
    p = ns.Pipeline("p")
    left = source(p, "l").key_by(lambda r: r[0])
    right = source(p, "r").key_by(lambda r: r[0])
    j = left.join(right, name="j")
    op = JoinOp(j.node, {"L"})
    return op, wire(op, inputs=("L", "R"))


@SETTINGS
@given(
    left=st.lists(st.sampled_from("abc"), max_size=8),
    right=st.lists(st.sampled_from("abc"), max_size=8),
    data=st.data(),
)
def test_join_emits_every_pair_once_in_any_arrival_order(left, right, data):
    lrecs = [(k, f"L{i}") for i, k in enumerate(left)]
    rrecs = [(k, f"R{i}") for i, k in enumerate(right)]
    order = data.draw(st.permutations(["L"] * len(lrecs) + ["R"] * len(rrecs)))
    # cut the arrival order into batches of one side each
    queues = {"L": list(lrecs), "R": list(rrecs)}
    op, out = join_op()
    epoch = 0
    for side, run in itertools.groupby(order):
        n = len(list(run))
        while n:
            take = data.draw(st.integers(1, n))
            op.push([queues[side].pop(0) for _ in range(take)], epoch, side)
            n -= take
            epoch += data.draw(st.integers(0, 1))
    expected = collections.Counter((lk, (lv, rv)) for lk, lv in lrecs for rk, rv in rrecs if lk == rk)
    got = collections.Counter(out.records)
    assert got == expected
    assert max(got.values(), default=1) == 1


def test_join_pairs_are_left_then_right():
    op, out = join_op()
    op.push([("k", "r1")], 0, "R")
    op.push([("k", "l1")], 0, "L")
    op.push([("k", "r2"), ("z", "r3")], 0, "R")
    assert out.records == [("k", ("l1", "r1")), ("k", ("l1", "r2"))]


# -- frontier --------------------------------------------------------------------------------


@SETTINGS
@given(
    events=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 6), st.none() | st.integers(0, 100), st.booleans()),
        max_size=25,
    )
)
def test_frontier_is_the_min_over_inputs(events):
    p = ns.Pipeline("p")
    a, b, c = source(p), source(p), source(p)
    op, out = run_op(a.union(b, c), inputs="abc")
    latest = dict.fromkeys("abc", -1)
    wms: dict = dict.fromkeys("abc")
    frontier = -1
    expected = []
    for ch, epoch, wm, eos in events:
        eos = eos and epoch > 4  # EOS now and then
        op.marker(ch, epoch, wm, eos)
        if epoch <= latest[ch] and not eos:
            continue  # a stale marker changes nothing
        latest[ch] = EOS if eos else epoch
        if wm is not None:
            wms[ch] = wm if wms[ch] is None else max(wms[ch], wm)
        f = min(latest.values())
        if f > frontier:
            frontier = f
            out_wm = None if any(w is None for w in wms.values()) else min(wms.values())
            expected.append((f, out_wm, f == EOS))
        assert op.frontier == frontier
    assert out.markers == expected


def test_frontier_end_of_stream():
    p = ns.Pipeline("p")
    a, b = source(p), source(p)
    op, out = run_op(a.union(b), inputs="ab")
    op.marker("a", 3, None, True)
    assert out.markers == []
    op.marker("b", 1, None, False)
    op.marker("b", 1, None, False)
    op.marker("b", 7, None, True)
    assert out.markers == [(1, None, False), (EOS, None, True)]
    assert op.frontier == EOS


# -- user functions that raise ---------------------------------------------------------------


def test_user_function_that_raises_names_operator_and_line():
    p = ns.Pipeline("p")
    s = source(p)
    line = next_line()
    m = s.map(lambda x: 1 // x, name="inverse")
    op, out = run_op(m)
    op.push([1, 2], 0, "in")
    with pytest.raises(RunFailed) as ei:
        op.push([3, 0], 0, "in")
    msg = str(ei.value)
    assert "'inverse'" in msg
    assert f"{THIS_FILE}:{line}" in msg
    assert "ZeroDivisionError" in msg
    assert isinstance(ei.value.__cause__, ZeroDivisionError)
    assert out.records == [1, 0]


def test_raising_keyed_functions_name_their_operator():
    p = ns.Pipeline("p")
    line = next_line()
    k = source(p).key_by(lambda r: r["id"], name="by_id")
    op, _ = run_op(k)
    with pytest.raises(RunFailed, match=rf"'by_id' \(declared at .*test_operators.py:{line}\).*KeyError"):
        op.push([{"x": 1}], 0, "in")

    keyed = source(p).key_by(str)
    line = next_line()
    w = keyed.window(5, lambda v: v + "", int, max, name="win")
    op, _ = run_op(w)
    with pytest.raises(RunFailed, match=rf"'win' \(declared at .*test_operators.py:{line}\).*TypeError"):
        op.push([("k", 1)], 0, "in")


def test_error_downstream_is_reported_by_the_downstream_operator():
    p = ns.Pipeline("p")
    up = source(p).map(lambda x: x + 1, name="up")
    line = next_line()
    down = up.filter(lambda x: 10 / (x - 2), name="down")
    up_op, down_op = make_op(up.node), make_op(down.node)
    up_op.connect(down_op.push, down_op.marker, "f")
    down_op.add_input("f")
    up_op.add_input("in")
    with pytest.raises(RunFailed) as ei:
        up_op.push([1], 0, "in")
    assert "'down'" in str(ei.value) and f":{line})" in str(ei.value)
    assert "'up'" not in str(ei.value)


# -- iterate, wired as the worker wires it ---------------------------------------------------


class Loop:
    """A loop on one worker, wired as nosync/runtime/worker.py's `build` wires it: the head
    (loop_entry) feeds the body, the body's edges are forward, the exit feeds the tail
    (iterate), whose back edge goes to the head (directly: one worker) and whose output goes
    to a Collector. `feed` pushes the loop's input, `close` finishes an epoch of it."""

    def __init__(self, p: ns.Pipeline, it_stream: ns.Stream, max_rounds: int | None = None) -> None:
        pl = plan(p, 1)
        nodes = p.nodes
        ops = {}
        for n in nodes:
            if n.kind in ("source", "sink"):
                continue
            ops[n.id] = LoopTail(n) if n.kind == "iterate" else LoopHead(n) if n.kind == "loop_entry" else make_op(n)
        for e in pl.edges:
            if e.src not in ops or e.dst not in ops:
                continue
            src, dst = ops[e.src], ops[e.dst]
            if e.feedback:
                assert not e.exchange  # a body without exchanges: the loop stays on its worker
                connect_back_edge(e, src, dst)
                dst.add_input(("f", e.id))
            else:
                chan = ("f", e.id)
                src.connect(dst.push, dst.marker, chan)
                dst.add_input(chan)
        finish_loops(pl, ops, max_rounds)
        self.tail = ops[it_stream.node.id]
        self.head = ops[it_stream.node.params["entry"]]
        self.out = Collector()
        self.tail.connect(self.out.push, self.out.marker, "out")
        self.head.add_input("src")

    def feed(self, records: list, epoch: int) -> None:
        self.head.push(records, epoch, "src")

    def close(self, epoch: int) -> None:
        self.head.marker("src", epoch, None, epoch == EOS)


def loop_pipeline(body, keep, max_iterations=None, name="loop"):
    p = ns.Pipeline("p")
    it = source(p).iterate(body, keep=keep, max_iterations=max_iterations, name=name)
    it.sink(ns.sinks.Console())
    return p, it


def halving_rounds(n: int) -> tuple[int, int]:
    """What halving n leaves the loop as, and the passes through the body it takes (a model)."""
    x, r = n // 2, 1
    while x > 1:
        x, r = x // 2, r + 1
    return x, r


@SETTINGS
@given(batches=st.lists(st.lists(st.integers(0, 300), max_size=6), max_size=5))
def test_iterate_halving(batches):
    p, it_stream = loop_pipeline(lambda s: s.map(lambda n: n // 2), keep=lambda n: n > 1)
    loop = Loop(p, it_stream)
    for epoch, batch in enumerate(batches):
        loop.feed(batch, epoch)
        loop.close(epoch)
    assert collections.Counter(loop.out.records) == collections.Counter(
        halving_rounds(n)[0] for b in batches for n in b
    )
    # each epoch goes round until a round keeps nothing: as many passes as its longest record
    # takes (one pass for an epoch without records)
    assert loop.head.waves == sum(max((halving_rounds(n)[1] for n in b), default=1) for b in batches)
    # records leave tagged with their epoch, epochs in order, each epoch marked finished after its records
    assert [e for _, e in loop.out.batches] == sorted(e for _, e in loop.out.batches)
    assert {e for _, e in loop.out.batches} == {e for e, b in enumerate(batches) if b}
    assert [m[0] for m in loop.out.markers] == list(range(len(batches)))


def test_iterate_with_fan_out_and_filter():
    def body(s):
        return s.flat_map(lambda n: [n - 1, n - 2]).filter(lambda n: n >= 0)

    p, it_stream = loop_pipeline(body, keep=lambda n: n > 1)
    loop = Loop(p, it_stream)

    def leaves(n: int) -> list[int]:
        res = []
        for m in (n - 1, n - 2):
            if m >= 0:
                res.extend(leaves(m) if m > 1 else [m])
        return res

    loop.feed([5, 0, 9], 0)
    loop.close(EOS)
    expected = leaves(5) + leaves(0) + leaves(9)
    assert collections.Counter(loop.out.records) == collections.Counter(expected)
    assert len(expected) == 8 + 0 + 55  # fib(6) + 0 + fib(10): records of 0 and 1 leave
    assert loop.out.markers == [(EOS, None, True)]


def test_a_later_epoch_waits_at_the_head_until_the_loop_has_finished_the_earlier():
    p, it_stream = loop_pipeline(lambda s: s.map(lambda n: n - 1), keep=lambda n: n > 0)
    loop = Loop(p, it_stream)
    loop.feed([3], 0)  # round 0 of epoch 0: 3 -> 2, kept
    loop.feed([1], 2)  # epoch 2 waits
    assert loop.out.records == [] and loop.head.held == [[2, [1]]]
    loop.close(1)  # epoch 0 goes round (2 -> 1 -> 0); no record of epoch 1; epoch 2 starts: 1 -> 0 leaves
    assert loop.out.batches == [([0], 0), ([0], 2)]
    assert loop.out.markers == [(1, None, False)]  # epoch 2 is open until its input is finished
    loop.close(EOS)
    assert loop.out.markers == [(1, None, False), (EOS, None, True)]


def test_a_head_holding_much_later_input_stops_the_sources_only_once_its_own_input_has_passed(monkeypatch):
    monkeypatch.setattr(loops, "HOLD_RECORDS", 5)
    p, it_stream = loop_pipeline(lambda s: s.map(lambda n: n - 1), keep=lambda n: n > 0)
    loop = Loop(p, it_stream)
    # the tails' reports held back, as when they come from other workers
    reports: list = []
    push, _, event = loop.tail.back
    loop.tail.back = (push, lambda *a: reports.append(a), event)
    back = ("f", loop.head.back_edge)

    def deliver() -> None:
        while reports:
            _, epoch, wm, eos = reports.pop(0)
            loop.head.marker(back, epoch, wm, eos)

    loop.feed(list(range(1, 11)), 1)  # ten records of epoch 1 wait: the loop is at epoch 0
    assert loop.head.held_count == 10
    assert not loop.head.full  # it still waits for input of epoch 0: the sources must go on
    loop.close(0)  # round 0 of epoch 0 closes; the reports on it have not come yet
    assert loop.head.full
    deliver()  # epoch 0 ends (no records), epoch 1 starts: its input is let in
    assert loop.head.epoch == 1 and loop.head.held_count == 0 and not loop.head.full
    loop.close(EOS)
    deliver()
    assert loop.head.finished and not loop.head.full
    assert collections.Counter(loop.out.records) == collections.Counter({0: 10})


def test_iterate_forwards_markers():
    p, it_stream = loop_pipeline(lambda s: s.map(abs), keep=lambda n: False)
    loop = Loop(p, it_stream)
    loop.feed([-1, 2], 0)
    loop.close(0)
    loop.close(EOS)
    assert loop.out.batches == [([1, 2], 0)]
    assert loop.out.markers == [(0, None, False), (EOS, None, True)]


def test_iterate_max_iterations_fails_the_run():
    p = ns.Pipeline("p")
    s = source(p)
    line = next_line()
    it_stream = s.iterate(lambda b: b.map(lambda n: n + 1), keep=lambda n: n > 0, max_iterations=3, name="spin")
    it_stream.sink(ns.sinks.Console())
    loop = Loop(p, it_stream)
    loop.feed([-5, -2], 0)  # each leaves after one pass
    loop.close(0)
    assert loop.out.records == [-4, -1]
    loop.feed([-1, 7], 1)  # 7 keeps growing
    with pytest.raises(RunFailed) as ei:
        loop.close(1)
    msg = str(ei.value)
    assert "'spin'" in msg and f"{THIS_FILE}:{line}" in msg
    assert "did not converge" in msg and "3 rounds" in msg


def test_iterate_max_iterations_is_the_exact_bound():
    p, it_stream = loop_pipeline(lambda s: s.map(lambda n: n - 1), keep=lambda n: n > 0, max_iterations=3)
    loop = Loop(p, it_stream)
    loop.feed([3, 1, 2], 0)  # 3 needs exactly 3 passes
    loop.close(0)
    assert loop.out.records == [0, 0, 0]
    loop.feed([4], 1)
    with pytest.raises(RunFailed, match="3 rounds"):
        loop.close(1)


def test_the_run_option_bounds_a_loop_without_its_own_bound():
    p, it_stream = loop_pipeline(lambda s: s.map(lambda n: n - 1), keep=lambda n: n > 0)
    loop = Loop(p, it_stream, max_rounds=2)
    loop.feed([2], 0)
    loop.close(0)
    assert loop.out.records == [0]
    loop.feed([3], 1)
    with pytest.raises(RunFailed, match="'loop'.*2 rounds"):
        loop.close(1)


def test_iterate_body_error_names_the_body_operator():
    p = ns.Pipeline("p")
    s = source(p)
    body_lines: list[int] = []

    def body(b):
        body_lines.append(next_line())
        return b.map(lambda n: 10 // n, name="divide")

    it_stream = s.iterate(body, keep=lambda n: n > 1, name="loop")
    it_stream.sink(ns.sinks.Console())
    loop = Loop(p, it_stream)
    loop.feed([20], 0)  # 10 // 20 = 0 leaves the loop
    assert loop.out.records == [0]
    with pytest.raises(RunFailed) as ei:
        loop.feed([0], 0)
    msg = str(ei.value)
    assert "'divide'" in msg and f"{THIS_FILE}:{body_lines[0]}" in msg
    assert "ZeroDivisionError" in msg


def test_a_keep_predicate_that_raises_names_the_loop_and_its_line():
    p = ns.Pipeline("p")
    s = source(p)
    line = next_line()
    it_stream = s.iterate(lambda b: b.map(lambda n: n), keep=lambda n: 1 // n > 0, name="picky")
    it_stream.sink(ns.sinks.Console())
    loop = Loop(p, it_stream)
    with pytest.raises(RunFailed) as ei:
        loop.feed([0], 0)
    msg = str(ei.value)
    assert "'picky'" in msg and f"{THIS_FILE}:{line}" in msg and "keep" in msg and "ZeroDivisionError" in msg


# -- sink operator ---------------------------------------------------------------------------


class Clock:
    ts = 0.0


def test_sink_commits_at_the_frontier_and_refuses_committed_epochs(tmp_path):
    p = ns.Pipeline("p")
    sink_def = ns.sinks.Files(str(tmp_path / "out"))
    source(p).sink(sink_def, name="out")
    node = p.node("out")
    op = SinkOp(node, sink_def.open_part(0, "run"), Clock())
    op.add_input("in")
    op.push([1, 2], 0, "in")
    op.push([3], 1, "in")
    assert sink_def.read_committed() == []
    op.marker("in", 0, None, False)
    assert sink_def.read_committed() == [1, 2]
    assert op.committed == 2
    with pytest.raises(RunFailed, match="'out' got 1 records of epoch 0 after committing it"):
        op.push([9], 0, "in")
    op.marker("in", 1, None, True)
    assert sink_def.read_committed() == [1, 2, 3]


@pytest.mark.parametrize("sink", ["files", "leveldb"])
def test_a_precommit_waiting_holds_back_later_ones_only_where_order_matters(tmp_path, sink):
    """Pre-commits 1 (epochs 0-1) and 2 (epoch 2); only 2 is ready. A Files sink (a multiset of
    records per epoch) publishes 2 and keeps 1 waiting; a LevelDB sink (the last write of a
    key wins) publishes neither until 1 is ready, then both, 1 first."""
    p = ns.Pipeline("p")
    if sink == "files":
        sink_def = ns.sinks.Files(str(tmp_path / "out"))
    else:
        sink_def = ns.sinks.LevelDB(str(tmp_path / "out"))
    source(p).sink(sink_def, name="out")
    op = SinkOp(p.node("out"), sink_def.open_part(0, "run"), Clock())
    op.add_input("in")
    op.push([("a", 1), ("b", 1)], 0, "in")
    op.push([("a", 2)], 1, "in")
    op.precommit(1, 1, durable=False)
    op.push([("a", 3), ("c", 1)], 2, "in")
    op.precommit(2, 2, durable=False)

    def committed():
        if sink == "files":
            return sorted(map(tuple, sink_def.read_committed()))
        part = op.part
        return sorted((msgpack.unpackb(k), msgpack.unpackb(v)) for k, v in part.db)

    assert op.commit_ready(lambda c: c == 2) == ([2] if sink == "files" else [])
    if sink == "files":
        assert committed() == [("a", 3), ("c", 1)]
        assert op.committed == 2
    else:
        assert committed() == []
    assert op.commit_ready(lambda c: True) == ([1] if sink == "files" else [1, 2])
    assert op.precommitted == []
    assert op.committed == 5
    if sink == "files":
        assert committed() == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)]
    else:
        assert committed() == [("a", 3), ("b", 1), ("c", 1)]


def test_a_files_sink_syncs_its_directory_once_for_the_commits_a_snapshot_records(tmp_path, monkeypatch):
    """A commit renames its files into the output directory without fsyncing it; the
    snapshot's meta that counts the commits fsyncs the directory once for all of them, and a
    meta with no commit since fsyncs nothing."""
    import nosync.api.sink_files as sinks_mod

    synced = []
    real = sinks_mod.fsync_dir

    def spy(path):
        synced.append(os.path.realpath(path))
        real(path)

    monkeypatch.setattr(sinks_mod, "fsync_dir", spy)
    p = ns.Pipeline("p")
    out = tmp_path / "out"
    sink_def = ns.sinks.Files(str(out))
    source(p).sink(sink_def, name="out")
    op = SinkOp(p.node("out"), sink_def.open_part(0, "run"), Clock())
    op.add_input("in")
    for c in (1, 2, 3):
        op.push([c], c, "in")
        op.precommit(c, c, durable=False)
    assert op.commit_ready(lambda c: c <= 2) == [1, 2]
    assert sorted(sink_def.read_committed()) == [1, 2]
    assert str(out.resolve()) not in synced
    meta = op.snapshot_meta()
    assert meta["committed"] == 2
    assert synced.count(str(out.resolve())) == 1
    op.snapshot_meta()
    assert synced.count(str(out.resolve())) == 1
    assert op.commit_ready(lambda c: True) == [3]
    op.snapshot_meta()
    assert synced.count(str(out.resolve())) == 2


def test_self_join_keeps_its_two_inputs_apart():
    """Both inputs of ks.join(ks) read the same operator: each record joins every record of
    its key on the other side (a full cross product per key)."""
    p = ns.Pipeline("self_join")
    ks = p.source(ns.sources.Generator(records=6, fn=lambda i: i % 2)).key_by(lambda x: x)
    ks.join(ks).sink(ns.sinks.Null())
    w = Worker(0, 0, {"workers": 1, "secret": b"s", "mode": "none", "run_id": "r"}, WorkerHooks())
    w.build(plan(p, 1))
    got: list = []
    w.sinks[0].part.write = lambda epoch, recs: got.extend(recs)
    w.sources[0].emit([0, 1, 0, 1, 0, 1], 0)
    expected = collections.Counter({(0, (0, 0)): 9, (1, (1, 1)): 9})
    assert collections.Counter(got) == expected


# -- epoch by epoch (mode replay) -----------------------------------------------------------


@SETTINGS
@given(data=st.data(), epochs=st.integers(1, 5), channels=st.integers(2, 3))
def test_aligned_operator_processes_epochs_one_after_the_other(data, epochs, channels):
    """Each channel sends, per epoch, a few records (tagged with their channel, epoch and
    index) then the epoch's marker; the channels interleave arbitrarily. An aligned aggregate
    must process every record of epoch e before any of e + 1, keep each channel's order, and
    tag what it emits for e with e; its markers follow."""
    p = ns.Pipeline("p")
    k = source(p).key_by(lambda r: r[0])
    op = make_op(k.aggregate(list, lambda acc, v: [*acc, v]).node)
    op.hooks = WorkerHooks()
    op.align_epochs = True
    chans = [f"c{i}" for i in range(channels)]
    out = wire(op, chans)
    # per channel: its items in order, ("rec", epoch, i) or ("mark", epoch)
    items = {
        c: [
            x
            for e in range(epochs)
            for x in [
                *[("rec", e, i) for i in range(data.draw(st.integers(0, 3), label=f"{c} e{e}"))],
                ("mark", e),
            ]
        ]
        for c in chans
    }
    pos = dict.fromkeys(chans, 0)
    while any(pos[c] < len(items[c]) for c in chans):
        c = data.draw(st.sampled_from([c for c in chans if pos[c] < len(items[c])]))
        x = items[c][pos[c]]
        pos[c] += 1
        if x[0] == "rec":
            op.push([("k", (c, x[1], x[2]))], x[1], c)
        else:
            op.marker(c, x[1], None, False)
    seen = [rec[1][-1] for rec in out.records]  # the value each output appended last
    assert sorted(seen, key=lambda v: v[1]) == seen, "a record of a later epoch went first"
    for c in chans:
        assert [v for v in seen if v[0] == c] == [(c, x[1], x[2]) for x in items[c] if x[0] == "rec"]
    assert [(e, v[1]) for (_, e), v in zip(out.batches, seen, strict=True)] == [(v[1], v[1]) for v in seen]
    assert [m[0] for m in out.markers] == list(range(epochs))
    assert not op.blocked or all(op.inputs[c] > op.frontier for c in op.blocked)

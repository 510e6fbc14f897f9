"""Barrier alignment of mode abs, driven without Spark: `AbsHooks.on_event` with real operators
and real `lsm` stores, under a stand-in for the worker (the operators, the stores and the
control messages are what it provides to the hooks).

The expected snapshot of checkpoint n is computed here from the records that preceded barrier n
on each channel (a Counter: the operator counts records per key), never from the operator.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Callable, Iterator

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lsm
import nosync as ns
from nosync.errors import RunFailed
from nosync.modes.abs import STATE, AbsHooks, AbsOp
from nosync.places import legacy_places
from nosync.runtime import control
from nosync.runtime.graph import make_op

TIMEOUT_S = 10.0
"""Bound on a flush; it takes milliseconds when it works."""


class Worker:
    """What AbsHooks uses of a worker: its operators, identity, and the control channel."""

    def __init__(self, run_dir: str) -> None:
        self.ops: list = []
        self.sources: list = []
        self.sinks: list = []
        self.gen = 0
        self.index = 0
        self.spec = {"run_dir": run_dir}
        self.places = legacy_places(run_dir)
        self.sent: list[dict] = []

    def send_ctrl(self, msg: control.Message) -> None:
        self.sent.append(control.to_wire(msg))  # as the coordinator gets it

    def keepalive(self) -> None:
        pass

    def fence(self, what: str = "commits") -> str | None:
        return None  # holds its lease (`Links.fence`)


class Downstream:
    """The next operator: one timeline of what it got, records, markers and events alike."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def push(self, records: list, epoch: int, channel: object) -> None:
        self.log.append(("records", list(records), epoch))

    def marker(self, channel: object, epoch: int, wm: object, eos: bool) -> None:
        self.log.append(("marker", epoch, wm, eos))

    def event(self, channel: object, ev: dict) -> None:
        self.log.append(("event", dict(ev)))

    def events(self) -> list[dict]:
        return [e[1] for e in self.log if e[0] == "event"]

    def records_between(self, start: int | None, stop: int | None) -> list:
        """The records got between the start-th and the stop-th event (None: either end)."""
        marks = [i for i, e in enumerate(self.log) if e[0] == "event"]
        lo = -1 if start is None else marks[start]
        hi = len(self.log) if stop is None else marks[stop]
        return [r for e in self.log[lo + 1 : hi] if e[0] == "records" for r in e[1]]

    def records(self) -> list:
        return [r for e in self.log if e[0] == "records" for r in e[1]]


class Env:
    """An AbsHooks instance on a stand-in worker; every keyed operator gets a real store."""

    def __init__(self, run_dir) -> None:  # noqa: ANN001 - a pathlib.Path
        self.run_dir = run_dir
        self.h = AbsHooks()
        self.worker = Worker(str(run_dir))
        self.h.worker = self.worker

    def count_op(
        self, name: str, inputs: tuple, init: Callable[[], object] = int, add: Callable = lambda n, _: n + 1
    ) -> tuple:
        """An aggregate counting records per key (or folding them with `init` and `add`), with
        the given input channels."""
        p = ns.Pipeline("p")
        stream = p.source(ns.sources.Generator(records=0)).key_by(lambda r: r[0]).aggregate(init, add, name=name)
        op = make_op(stream.node)
        down = Downstream()
        op.connect(down.push, down.marker, "out", down.event)
        for ch in inputs:
            op.add_input(ch)
        op.hooks = self.h
        op.track_dirty = True
        self.worker.ops.append(op)
        self.h.stores[op.name] = lsm.Store(str(self.run_dir / name), retention=64)
        return op, down

    def saved(self, name: str, as_of: int) -> dict:
        """The counts the store of `name` holds right after seq `as_of`."""
        return self.h.stores[name].load(STATE, as_of=as_of)

    def close(self) -> None:
        self.h.close(self.worker)


@pytest.fixture
def env(tmp_path) -> Iterator[Env]:  # noqa: ANN001 - pytest's tmp_path
    e = Env(tmp_path)
    yield e
    e.close()


def running_counts(counts: collections.Counter, records: list) -> list:
    """What the counting operator emits for `records`, updating `counts`."""
    out = []
    for k, _ in records:
        counts[k] += 1
        out.append((k, counts[k]))
    return out


def B(n: int) -> dict:
    return {"barrier": n}


def run_bytes(pairs: list) -> int:
    """The size of the run of one append of an aggregate's state taken whole, as lsm/FORMAT.md
    defines it: a 120-byte header, no pairs, its key column and its value column (one msgpack
    array each): nothing hashed."""
    return 120 + len(msgpack.packb([k for k, _ in pairs])) + len(msgpack.packb([v for _, v in pairs]))


# -- one checkpoint --------------------------------------------------------------------------


def test_records_after_the_barrier_are_held_until_alignment(env):
    op, down = env.count_op("count", ("a", "b"))
    store = env.h.stores["count"]
    before_a = [("k1", 0), ("k2", 0), ("k1", 0)]
    before_b = [("k2", 0), ("k3", 0)]
    held = [[("k1", 1), ("k4", 1)], [("k1", 1)]]
    after_b = [("k3", 2), ("k2", 2)]

    counts: collections.Counter = collections.Counter()
    out_before = running_counts(counts, before_a) + running_counts(counts, before_b)
    op.push(before_a, 0, "a")
    op.push(before_b, 0, "b")

    op.event("a", B(1))
    assert down.events() == []
    assert op.blocked == {"a"}
    frozen = dict(op.state)
    n_log = len(down.log)
    for batch in held:
        op.push(batch, 1, "a")
    assert op.state == frozen  # held, not applied
    assert len(down.log) == n_log  # and nothing emitted for them
    assert op.held_records == 3
    assert store.last_seq == -1  # no snapshot before alignment

    out_before += running_counts(counts, after_b)
    op.push(after_b, 1, "b")  # b has no barrier yet: applied
    assert op.state == counts

    snapshot = dict(counts)
    op.event("b", B(1))
    assert store.last_seq == 1
    assert env.saved("count", 1) == snapshot  # exactly the records before the barrier on each channel
    for k, n in snapshot.items():
        assert store.get(STATE, k) == n
    assert store.get(STATE, "k4") is None  # a key only the held records have
    out_after = [r for batch in held for r in running_counts(counts, batch)]

    assert down.events() == [B(1)]  # forwarded once
    assert down.records_between(None, 0) == out_before
    assert down.records_between(0, None) == out_after  # the held records, after the barrier
    assert op.state == counts
    assert op.blocked == set() and op.held == [] and op.held_records == 0

    p = env.h.pending[1]
    assert p["left"] == set()
    [row] = p["instances"]
    assert row["operator"] == "count"
    assert row["align_ms"] >= 0
    assert row["held"] == 3
    # 7 updates of 3 keys before the barrier: the snapshot takes the state whole, as it was then
    assert row["bytes"] == run_bytes(list(snapshot.items()))
    assert p["ops"]["count"]["inputs"] == {"a": -1, "b": -1}


def test_barrier_on_the_second_channel_first(env):
    op, down = env.count_op("count", ("a", "b"))
    op.push([("x", 0)], 0, "a")
    op.event("b", B(1))
    assert op.blocked == {"b"}
    op.push([("x", 0), ("y", 0)], 0, "b")  # held
    op.push([("y", 0)], 0, "a")  # applied
    assert op.state == {"x": 1, "y": 1}
    op.event("a", B(1))
    assert env.saved("count", 1) == {"x": 1, "y": 1}
    assert down.records_between(0, None) == [("x", 2), ("y", 2)]
    assert env.h.pending[1]["instances"][0]["held"] == 2


def test_markers_on_a_blocked_channel_are_held_in_order(env):
    op, down = env.count_op("count", ("a", "b"))
    op.marker("a", 0, None, False)
    op.event("a", B(1))
    op.push([("x", 1)], 1, "a")
    op.marker("a", 1, None, False)  # held: the frontier cannot pass it
    op.marker("b", 0, None, False)
    op.marker("b", 1, None, False)
    assert op.frontier == 0
    assert [e for e in down.log if e[0] == "marker"] == [("marker", 0, None, False)]
    op.event("b", B(1))
    assert env.h.pending[1]["ops"]["count"]["frontier"] == 0  # the snapshot is from before the held marker
    assert op.frontier == 1
    assert down.log[1:] == [("event", B(1)), ("records", [("x", 1)], 1), ("marker", 1, None, False)]


def test_other_events_are_forwarded_without_blocking(env):
    op, down = env.count_op("count", ("a", "b"))
    op.event("a", {"note": 1})
    assert op.blocked == set()
    op.push([("x", 0)], 0, "a")
    assert down.log == [("event", {"note": 1}), ("records", [("x", 1)], 0)]
    assert env.h.pending == {}


def test_a_state_the_store_cannot_hold_fails_the_snapshot_naming_the_operator_and_key(env):
    op, down = env.count_op("dated", ("a", "b"), add=lambda n, v: datetime.date(2026, 1, 1) if v == "day" else n + 1)
    op.push([("ok", 0), ("d", "day")], 0, "a")
    op.event("a", B(1))
    with pytest.raises(RunFailed) as ei:
        op.event("b", B(1))
    msg = str(ei.value)
    assert "operator 'dated'" in msg and "key 'd'" in msg and "date" in msg, msg
    assert env.h.stores["dated"].last_seq == -1  # nothing of the snapshot was appended
    assert down.events() == []  # and its barrier went no further


# -- consecutive checkpoints ------------------------------------------------------------------


def test_next_barrier_on_a_blocked_channel_waits_for_the_previous_checkpoint(env):
    op, down = env.count_op("count", ("a", "b"))
    a0, b0 = [("k", 0), ("j", 0)], [("k", 0)]
    a1, a2 = [("k", 1), ("m", 1)], [("k", 2), ("j", 2), ("n", 2)]
    b1, b2 = [("j", 1)], [("m", 2)]
    counts: collections.Counter = collections.Counter()
    expected_before_1 = running_counts(counts, a0) + running_counts(counts, b0)
    op.push(a0, 0, "a")
    op.push(b0, 0, "b")
    op.event("a", B(1))
    op.push(a1, 1, "a")  # held
    op.event("a", B(2))  # held too: barrier 2 is handled after checkpoint 1
    op.push(a2, 2, "a")  # held
    assert 2 not in env.h.align.get("count", {})
    assert env.h.pending == {}
    assert op.held_records == len(a1) + len(a2)

    expected_before_1 += running_counts(counts, b1)
    op.push(b1, 1, "b")
    snapshot_1 = dict(counts)
    op.event("b", B(1))
    # checkpoint 1 taken; a1 replayed; barrier 2 blocks a again and a2 is held anew
    expected_1_2 = running_counts(counts, a1)
    assert env.saved("count", 1) == snapshot_1
    assert op.blocked == {"a"}
    assert op.held_records == len(a2)
    assert op.state == counts
    assert down.events() == [B(1)]
    assert env.h.pending[1]["instances"][0]["held"] == len(a1) + len(a2)
    assert 2 not in env.h.pending

    expected_1_2 += running_counts(counts, b2)
    op.push(b2, 2, "b")
    snapshot_2 = dict(counts)
    op.event("b", B(2))
    expected_after_2 = running_counts(counts, a2)

    store = env.h.stores["count"]
    assert store.last_seq == 2
    assert env.saved("count", 1) == snapshot_1
    assert env.saved("count", 2) == snapshot_2
    assert down.events() == [B(1), B(2)]
    assert down.records_between(None, 0) == expected_before_1
    assert down.records_between(0, 1) == expected_1_2
    assert down.records_between(1, None) == expected_after_2
    assert env.h.pending[2]["instances"][0]["held"] == len(a2)
    assert op.blocked == set() and op.held == []


def test_single_input_operator_never_blocks(env):
    op, down = env.count_op("solo", ("only",))
    op.push([("k", 0)], 0, "only")
    op.event("only", B(1))
    assert op.blocked == set()
    assert env.saved("solo", 1) == {"k": 1}
    op.push([("k", 1)], 1, "only")  # applied at once
    assert down.log == [("records", [("k", 1)], 0), ("event", B(1)), ("records", [("k", 2)], 1)]
    [row] = env.h.pending[1]["instances"]
    assert row["operator"] == "solo" and row["align_ms"] == 0 and row["held"] == 0
    op.event("only", B(2))
    assert env.saved("solo", 2) == {"k": 2}


# -- acknowledgement -----------------------------------------------------------------------------


def poll_until_acked(env: Env, count: int) -> list[dict]:
    """Polls (no sleeps: the stores were flushed) until `count` acks were sent."""
    for store in env.h.stores.values():
        store.flush("disk", timeout=TIMEOUT_S)
    for _ in range(100):
        env.h.poll(env.worker)
        if len(env.worker.sent) >= count:
            break
    return env.worker.sent


def test_ack_once_every_instance_snapshotted_and_stores_are_durable(env):
    op, _ = env.count_op("count", ("a", "b"))
    solo, _ = env.count_op("solo", ("only",))
    op.push([("k", 0), ("k", 0)], 0, "a")
    solo.push([("s", 0)], 0, "only")
    op.event("a", B(1))
    solo.event("only", B(1))
    for store in env.h.stores.values():
        store.flush("disk", timeout=TIMEOUT_S)
    env.h.poll(env.worker)
    assert env.worker.sent == []  # "count" has not snapshotted checkpoint 1
    assert env.h.pending[1]["left"] == {"count"}

    op.event("b", B(1))
    [ack] = poll_until_acked(env, 1)
    assert ack["type"] == "mode" and ack["op"] == "ack"
    assert ack["n"] == 1 and ack["gen"] == 0
    assert set(ack["ops"]) == {"count", "solo"}
    assert {r["operator"] for r in ack["instances"]} == {"count", "solo"}
    assert all("async_ms" in r for r in ack["instances"])
    assert env.h.pending == {}
    assert env.h.acked == 1
    env.h.poll(env.worker)
    assert len(env.worker.sent) == 1  # acknowledged once
    assert env.saved("count", 1) == {"k": 2}
    assert env.saved("solo", 1) == {"s": 1}


def test_acks_are_sent_in_checkpoint_order(env):
    op, _ = env.count_op("count", ("a", "b"))
    for n in (1, 2, 3):
        op.push([("k", 0)], n, "a")
        op.event("a", B(n))
        op.event("b", B(n))
    acks = poll_until_acked(env, 3)
    assert [a["n"] for a in acks] == [1, 2, 3]
    assert [env.saved("count", n) for n in (1, 2, 3)] == [{"k": 1}, {"k": 2}, {"k": 3}]
    assert env.h.can_finish(env.worker)


def test_an_aborted_checkpoint_does_not_hold_back_the_next_ones(env):
    """The coordinator aborts checkpoint 1 (it timed out) while barrier 1 is still on its way
    to an operator that is aligning; the operator snapshots 1 when the barrier arrives. The
    worker must still acknowledge checkpoint 2, and be able to finish."""
    op, _ = env.count_op("count", ("a", "b"))
    solo, _ = env.count_op("solo", ("only",))  # snapshots at once, as a source does at the trigger
    solo.event("only", B(1))
    op.event("a", B(1))
    env.h.on_control(env.worker, control.mode_message(AbsOp.ABORT, gen=0, n=1).as_map())
    op.event("b", B(1))  # the rest of barrier 1, after the abort
    solo.event("only", B(2))
    op.event("a", B(2))
    op.event("b", B(2))
    acks = poll_until_acked(env, 1)
    assert 2 in [a["n"] for a in acks], f"checkpoint 2 never acknowledged; pending: {sorted(env.h.pending)}"
    assert env.h.can_finish(env.worker)


# -- model: any interleaving of two channels ------------------------------------------------------

N_CHECKPOINTS = 3


@st.composite
def channel_items(draw) -> list:
    """One channel's sequence: batches of keyed records with barriers 1..N in order."""
    items: list = []
    for n in range(1, N_CHECKPOINTS + 2):
        for _ in range(draw(st.integers(0, 2))):
            items.append(("records", draw(st.lists(st.sampled_from("pqr"), min_size=1, max_size=3))))
        if n <= N_CHECKPOINTS:
            items.append(("barrier", n))
    return items


@settings(max_examples=40, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
@given(a=channel_items(), b=channel_items(), data=st.data())
def test_snapshot_n_is_what_preceded_barrier_n_on_every_channel(tmp_path_factory, a, b, data):
    order = data.draw(st.permutations(["a"] * len(a) + ["b"] * len(b)), label="arrival order")
    env = Env(tmp_path_factory.mktemp("run"))
    try:
        op, down = env.count_op("count", ("a", "b"))
        expected: dict[int, collections.Counter] = {}
        for n in range(1, N_CHECKPOINTS + 1):
            keys = []
            for items in (a, b):
                cut = items.index(("barrier", n))
                keys += [k for what, ks in items[:cut] if what == "records" for k in ks]
            expected[n] = collections.Counter(keys)
        queues = {"a": list(a), "b": list(b)}
        for ch in order:
            what, x = queues[ch].pop(0)
            if what == "records":
                op.push([(k, None) for k in x], 0, ch)
            else:
                op.event(ch, B(x))
        everything = collections.Counter(k for items in (a, b) for what, ks in items if what == "records" for k in ks)
        assert op.state == everything
        assert op.blocked == set() and op.held == []
        assert down.events() == [B(n) for n in range(1, N_CHECKPOINTS + 1)]
        for n in range(1, N_CHECKPOINTS + 1):
            assert env.saved("count", n) == expected[n], f"checkpoint {n}"
            # before barrier n was forwarded, the operator emitted one output per record before it
            assert len(down.records_between(None, n - 1)) == sum(expected[n].values())
        emitted = collections.defaultdict(list)
        for k, c in down.records():
            emitted[k].append(c)
        assert emitted == {k: list(range(1, c + 1)) for k, c in everything.items()}
    finally:
        env.close()


def test_checkpoint_stores_hold_their_merges_to_the_persistence_budget(tmp_path):
    """abs's stores merge within --persist-budget, as mode nosync's store does: the two modes
    compete for the same cores on equal terms."""
    h = AbsHooks({"persist_budget": 0.2})
    worker = Worker(str(tmp_path))
    p = ns.Pipeline("p")
    stream = p.source(ns.sources.Generator(records=0)).key_by(lambda r: r[0]).reduce(lambda a, b: a + b, name="counts")
    worker.ops.append(make_op(stream.node))
    h._open_stores(worker)
    try:
        assert h.stores["counts"].options.budget == 0.2
    finally:
        h.close(worker)

"""When a nosync worker snapshots: not while `max_concurrent_snapshots` of its snapshots are not
yet durable (a snapshot taken then would only queue behind the others), as soon as one is
durable (indexing is the persister's business, not the worker's), and, once its persistence
costs more than its budget, less often. A real `lsm` store; its persister is held back by taking
the lock it does each step under (or by a gate on its LevelDB writes), so "not yet durable" is a
fact, not a timing. The worker is a stand-in for what the hooks use of it."""

from __future__ import annotations

import threading
import time

import pytest

import nosync as ns
from lsm import Store
from nosync.modes.nosync import NosyncHooks
from nosync.modes.nosync.outlog import OutputLog
from nosync.modes.nosync.snapshots import RetentionWindow
from nosync.runtime import control
from nosync.runtime.graph import make_op
from nosync.runtime.source_op import Stop


class StandInSource:
    finished = False
    records_in = 0


class StandInWorker:
    index = 0
    gen = 0
    routers: list = []
    sinks: list = []

    def __init__(self, ops: list | None = None) -> None:
        self.sources = [StandInSource()]
        self.ops = ops or []
        self.ctrl: list[dict] = []
        self.stop = Stop()  # a run not being stopped

    def send_ctrl(self, msg: control.Message) -> None:
        self.ctrl.append(control.to_wire(msg))  # as the coordinator gets it


def counts(keys: int):
    """A reduce operator holding `keys` keys, every one of them changed since the last snapshot."""
    p = ns.Pipeline("p")
    keyed = p.source(ns.sources.Generator(records=0)).key_by(lambda r: r)
    op = make_op(keyed.reduce(lambda a, b: a + b, name="r").node)
    op.track_dirty = True
    op.state = {f"k{i}": i for i in range(keys)}
    op.dirty = set(op.state)
    return op


def hooks_on(tmp_path, ops: list | None = None, **options) -> tuple[NosyncHooks, StandInWorker]:
    hooks = NosyncHooks({"persist_ms": 1, **options})
    worker = StandInWorker(ops)
    hooks.w = worker
    hooks.store = Store(str(tmp_path / "log"))
    hooks.outlog = OutputLog(str(tmp_path / "spill"), 1 << 20)
    return hooks, worker


def step_and_poll(hooks: NosyncHooks, worker: StandInWorker, since_s: float = 1.0) -> None:
    hooks.log_step(("s", 0, None))  # a step was taken since the last snapshot
    hooks.last_snapshot -= since_s  # and this long has passed
    hooks.poll(worker)


def wait_until(what: str, cond) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, f"{what} did not happen in 30 s"
        time.sleep(0.005)


def settle(hooks: NosyncHooks, worker: StandInWorker) -> None:
    """Waits until everything appended is durable, and lets the hooks take it in."""
    target = hooks.store.last_seq
    wait_until("durability", lambda: hooks.store.durable("disk") >= target)
    hooks.poll(worker)
    assert not hooks.pending


@pytest.mark.parametrize("most", [1, 2])
def test_no_more_snapshots_under_way_than_allowed(tmp_path, most):
    hooks, worker = hooks_on(tmp_path, max_concurrent_snapshots=most)
    try:
        with hooks.store._tier_lock:  # the persister can neither log nor index meanwhile
            for _ in range(5):
                step_and_poll(hooks, worker)
            assert hooks.snapshots == most
            held_back = hooks.snapshot_step
            assert hooks.step > held_back
        settle(hooks, worker)
        step_and_poll(hooks, worker)
        # every earlier one is durable: the steps since are snapshotted at once
        assert hooks.snapshots == most + 1
        assert hooks.snapshot_step == hooks.step
        assert worker.ctrl[-1]["point"]["step"] >= held_back
    finally:
        hooks.store.close()


def test_a_snapshot_durable_but_not_indexed_is_no_longer_under_way(tmp_path):
    hooks, worker = hooks_on(tmp_path)
    gate = threading.Event()
    disk = hooks.store._disk
    write = disk.write

    def held_write(*args, **kwargs):  # the persister logs (durable), then waits to index
        gate.wait(60)
        return write(*args, **kwargs)

    disk.write = held_write
    try:
        step_and_poll(hooks, worker)
        first = hooks.store.last_seq
        wait_until("the snapshot's log write", lambda: hooks.store.durable("disk") >= first)
        assert hooks.store.indexed < first
        hooks.poll(worker)
        assert hooks.durable_seq == first, "a durable snapshot was not taken in while its indexing waited"
        step_and_poll(hooks, worker)
        assert hooks.snapshots == 2, "a snapshot waited for the one before to be indexed"
    finally:
        gate.set()
        hooks.store.close()


def test_bytes_appended_and_not_durable_count_against_the_bound(tmp_path):
    hooks, worker = hooks_on(tmp_path, ops=[counts(150_000)], max_unpersisted_mb=1)
    try:
        with hooks.store._tier_lock:
            step_and_poll(hooks, worker)  # a snapshot of 150,000 keys, held back
            assert hooks.snapshots == 1 and hooks.unpersisted > 1 << 20
            assert not hooks.may_read(worker), "sources read on past the bound on bytes not durable"
        settle(hooks, worker)
        assert hooks.may_read(worker)
        assert hooks.stall_s > 0
    finally:
        hooks.store.close()


def test_the_interval_stretches_over_budget_and_shrinks_back(tmp_path):
    big = counts(100_000)
    # no bound on the stretch here (the next test has one)
    hooks, worker = hooks_on(tmp_path, ops=[big], persist_budget=0.001, max_persist_ms=10**9)
    try:
        with hooks.store._tier_lock:  # not durable before the hooks' poll
            step_and_poll(hooks, worker)
        # indexed (its keys hashed for the index entry) before the hooks take its durability in,
        # so that the persister's work on it counts in its cost, not in the next one's
        hooks.store._persister.drain_index()
        settle(hooks, worker)
        # 100,000 keys cost well over a millisecond to snapshot: at a 0.1% budget, the next
        # interval is over a second, where persist_ms is 1 ms
        stretched = hooks.interval_s
        assert stretched > 1.0
        step_and_poll(hooks, worker, since_s=0.5)
        assert hooks.snapshots == 1, "a snapshot came before the stretched interval"
        step_and_poll(hooks, worker, since_s=stretched)
        assert hooks.snapshots == 2
        settle(hooks, worker)
        # that one changed nothing but a step: it cost far less, and the interval came back down
        assert hooks.interval_s < stretched / 3
        count, total, most = hooks.intervals
        assert count == 2 and most == stretched and total == stretched + hooks.interval_s
    finally:
        hooks.store.close()


def test_the_interval_stretches_no_further_than_max_persist_ms(tmp_path):
    # the same snapshot as above, which at a 0.1% budget asks for an interval over a second
    hooks, worker = hooks_on(tmp_path, ops=[counts(100_000)], persist_budget=0.001, max_persist_ms=300)
    try:
        step_and_poll(hooks, worker)
        settle(hooks, worker)
        assert hooks.interval_s == 0.3, "the interval went past --max-persist-ms"
        assert hooks.over_budget == 1
        assert hooks.metrics(worker)["over_budget"] == 1
    finally:
        hooks.store.close()


def test_a_generous_budget_keeps_the_shortest_interval(tmp_path):
    hooks, worker = hooks_on(tmp_path, ops=[counts(1000)], persist_budget=1.0, persist_ms=60_000)
    try:
        hooks.last_snapshot = -1e9
        step_and_poll(hooks, worker)
        settle(hooks, worker)
        assert hooks.interval_s == 60.0, "the interval left --persist-ms though persistence was within budget"
    finally:
        hooks.store.close()


def test_the_retention_window_is_a_time_not_a_count_of_snapshots():
    """The store keeps the versions of every snapshot of the last RETENTION_S seconds and of the
    newest one before them, whatever the interval: a snapshot every second, then every 4 s (the
    budget stretched it), keeps 64 s of history either way. Seqs advance 10 a second here."""
    window = RetentionWindow(64.0)
    got = {t: window.add(10 * t, float(t)) for t in range(0, 100)}
    assert all(got[t] is None for t in range(64))  # not full: every version is kept
    assert got[64] == 640 and got[99] == 640  # back to the snapshot of 64 s before
    got = {t: window.add(10 * t, float(t)) for t in range(100, 400, 4)}
    # 64 s = 16 snapshots of 4 s: the window reaches the snapshot taken exactly 64 s before
    assert got[164] == 640 and got[396] == 640
    window.add(4005, 400.5)  # a snapshot half a second after the last: the newest at or before 336.5 is 336
    assert window.kept[0] == (3360, 336.0)


def test_the_snapshots_a_restore_found_stay_a_whole_window():
    """A restore's snapshots carry no time: each counts as taken at the restore, so none is let go
    before RETENTION_S has passed since."""
    window = RetentionWindow(64.0)
    window.restored([100, 200, 300], 1000.0)
    assert window.add(400, 1010.0) is None
    assert window.add(500, 1063.0) is None
    assert window.add(600, 1064.0) == 600 - 300  # the restore's newest is now 64 s old
    assert [seq for seq, _ in window.kept] == [300, 400, 500, 600]

"""A nosync worker takes no snapshot while `max_concurrent_snapshots` of its snapshots are still
being persisted (not durable on the tier, or not indexed on the disk tier): a snapshot taken
then would only queue behind the others. A real `lsm` store; its persister is held back by
taking the lock it does each step under, so "still being persisted" is a fact, not a timing.
The worker is a stand-in for what the hooks use of it."""

from __future__ import annotations

import threading
import time

import pytest

from lsm import Store
from nosync.modes.nosync import NosyncHooks


class StandInSource:
    finished = False


class StandInWorker:
    index = 0
    gen = 0
    routers: list = []
    sinks: list = []
    ops: list = []

    def __init__(self) -> None:
        self.sources = [StandInSource()]
        self.ctrl: list[dict] = []

    def send_ctrl(self, msg: dict) -> None:
        self.ctrl.append(msg)


def hooks_on(tmp_path, **options) -> tuple[NosyncHooks, StandInWorker]:
    hooks = NosyncHooks({"persist_ms": 1, **options})
    worker = StandInWorker()
    hooks.w = worker
    hooks.store = Store(str(tmp_path / "log"))
    return hooks, worker


def step_and_poll(hooks: NosyncHooks, worker: StandInWorker) -> None:
    hooks._log(("s", 0, None))  # a step was taken since the last snapshot
    hooks.last_snapshot -= 1.0  # and persist_ms has passed
    hooks.poll(worker)


def wait_until_persisted(hooks: NosyncHooks, step: int) -> None:
    deadline = time.monotonic() + 30
    while min(hooks.store.durable("disk"), hooks.store.indexed) < step:
        assert time.monotonic() < deadline, "the persister did not finish the snapshot in 30 s"
        time.sleep(0.005)


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
        wait_until_persisted(hooks, held_back)
        step_and_poll(hooks, worker)
        # the persister is done with every earlier one: the steps since are snapshotted at once
        assert hooks.snapshots == most + 1
        assert hooks.snapshot_step == hooks.step
        assert [m["point"]["step"] for m in worker.ctrl][-1] >= held_back
    finally:
        hooks.store.close()


def test_a_snapshot_durable_but_not_indexed_is_still_under_way(tmp_path):
    hooks, worker = hooks_on(tmp_path)
    gate = threading.Event()
    # the disk tier's one LevelDB writer thread waits on the gate first: the persister logs
    # (durable) and then blocks indexing
    hooks.store._disk._writer.submit(gate.wait, 60)
    try:
        step_and_poll(hooks, worker)
        first = hooks.snapshot_step
        deadline = time.monotonic() + 30
        while hooks.store.durable("disk") < first:
            assert time.monotonic() < deadline, "the snapshot was not logged in 30 s"
            time.sleep(0.005)
        assert hooks.store.indexed < first
        step_and_poll(hooks, worker)
        assert hooks.snapshots == 1, "a snapshot was taken while the one before was not indexed"
        gate.set()
        wait_until_persisted(hooks, first)
        step_and_poll(hooks, worker)
        assert hooks.snapshots == 2
    finally:
        gate.set()
        hooks.store.close()


def test_bytes_sent_since_the_last_snapshot_count_against_the_bound(tmp_path):
    hooks, worker = hooks_on(tmp_path, max_unpersisted_mb=1)
    try:
        with hooks.store._tier_lock:
            step_and_poll(hooks, worker)  # one snapshot under way, held back
            assert hooks.may_read(worker)
            hooks.new_out_bytes = 2 << 20  # frames sent since: not durable anywhere yet
            assert not hooks.may_read(worker), "sources read on past the bound on bytes not durable"
    finally:
        hooks.store.close()

"""Fencing a replaced attempt: the lease a worker holds from the coordinator's answers to its
beats, what a lapsed lease refuses (a sink's commit, a write to the shared tier, a peer's
connection), and the report a woken zombie gives before it stops. Real sockets, a real
coordinator, a real remote tier and sink files; a pause is a worker that stops beating and
reading, as a stopped process does."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable
from functools import partial

import pytest

import nosync as ns
from lsm.errors import FencedError
from lsm.records import Record
from lsm.remote import RemoteTier
from nosync.driver.coordinator import Coordinator
from nosync.errors import Replaced
from nosync.modes import get_mode
from nosync.options import RunOptions
from nosync.runtime import channels
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.links import LEASE_SHARE
from nosync.runtime.operators import SinkOp
from nosync.runtime.worker import Worker

SECRET = b"the run's secret"
DEADLINE_S = 10.0
TIMEOUT_MS = 600


class Clock:
    ts = 0.0


def wait_until(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def read_ctrl_until(w: Worker, cond: Callable[[], object], what: str) -> None:
    """The worker's loop reading its coordinator's messages, as it does between batches."""
    sel = selectors.DefaultSelector()
    sel.register(w.ctrl_conn.sock, selectors.EVENT_READ)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            if sel.select(0.02):
                w._read_ctrl()
    finally:
        sel.close()


@pytest.fixture
def run(tmp_path):
    """A coordinator (mode none, failure timeout TIMEOUT_MS) and worker 0 of 2, registered."""
    killed: list[int] = []
    c = Coordinator(
        2,
        SECRET,
        get_mode("none"),
        "run-1",
        run_dir=str(tmp_path),
        failure_timeout_s=TIMEOUT_MS / 1000,
        kill_task=lambda task, pid, reason: killed.append(task),
    )
    spec = {"workers": 2, "secret": SECRET, "run_id": "run-1", "coordinator": list(c.address), "run_dir": str(tmp_path)}
    w = Worker(0, 0, spec, WorkerHooks(RunOptions(failure_timeout_ms=TIMEOUT_MS)))
    w.task_id = 7
    w._register()
    try:
        yield c, w, killed
    finally:
        w._stop_beats()
        w.ctrl_conn.close()
        w.acceptor.close()
        c.close()


def test_a_beating_worker_holds_its_lease_and_a_paused_one_loses_it_before_it_is_suspected(run):
    c, w, _ = run
    assert w.lease_s == pytest.approx(TIMEOUT_MS / 1000 * LEASE_SHARE)
    # the coordinator's answers to its beats keep the lease fresh, for several leases' time
    until = time.monotonic() + 3 * w.lease_s
    read_ctrl_until(w, lambda: time.monotonic() > until, "three leases' time")
    assert w.fence() is None and w.lease_left() > 0
    assert w.refused == {"commits": 0, "writes": 0}
    # paused: no beat, nothing read; the lease lapses before the coordinator suspects
    w._stop_beats()
    wait_until(lambda: w.lease_left() <= 0, "the lease to lapse")
    assert c.suspicions == []
    wait_until(lambda: c.suspicions, "the suspicion of the paused worker")
    why = w.fence()
    assert why is not None and "worker 0 (attempt 0) holds no lease" in why
    assert w.refused["commits"] == 1


def test_a_woken_zombie_refuses_commits_and_writes_reports_them_and_is_counted(run, tmp_path):
    c, w, killed = run
    registered = w._lease_from
    read_ctrl_until(w, lambda: w._lease_from > registered, "an answer to a beat")
    w._stop_beats()
    wait_until(lambda: killed == [7], "the kill of the suspected worker's task")

    # the zombie wakes: a sink's commit and the remote tier's writes are refused
    p = ns.Pipeline("p")
    sink = ns.sinks.Files(str(tmp_path / "out"))
    p.source(ns.sources.Generator(records=3)).sink(sink, name="out")
    op = SinkOp(p.node("out"), sink.open_part(0, "run"), Clock())
    op.fence = w.fence
    op.add_input("in")
    op.push([1, 2], 0, "in")
    op.precommit(5, 0, durable=True)
    assert op.commit_ready(lambda ckpt: True) == []
    assert sink.read_committed() == [] and op.committed == 0 and len(op.precommitted) == 1

    tier = RemoteTier(str(tmp_path / "remote"))
    tier.fence = partial(w.fence, "writes")
    with pytest.raises(FencedError, match="write refused: worker 0"):
        tier.upload(0, [Record(0, 0, b"x")])
    with pytest.raises(FencedError):
        tier.drop_after(-1)
    tier.refresh()
    assert tier.files == []

    # it reads that it was replaced: it says what it refused, and stops
    with pytest.raises(Replaced, match=r"refused 1 sink commits and 2 shared-tier writes"):
        read_ctrl_until(w, lambda: False, "the Replaced message")
    assert w.replaced
    wait_until(lambda: c.fencing()["zombies_woke"] == 1, "the zombie's report")
    w.ctrl_conn.close()
    wait_until(lambda: c.fencing()["zombies_gone"] == 1, "the zombie's connection to end")
    assert c.fencing() == {
        "zombies": 1,
        "zombies_woke": 1,
        "zombie_commits_refused": 1,
        "zombie_writes_refused": 2,
        "zombies_gone": 1,
    }


def test_a_lapsed_lease_only_defers_a_commit_the_next_lease_makes(tmp_path):
    """A worker whose loop was busy past its lease (its beats went on) commits once it has read
    the coordinator's answers: nothing is lost, nothing is committed twice."""
    p = ns.Pipeline("p")
    sink = ns.sinks.Files(str(tmp_path / "out"))
    p.source(ns.sources.Generator(records=3)).sink(sink, name="out")
    op = SinkOp(p.node("out"), sink.open_part(0, "run"), Clock())
    lease = {"held": False}
    op.fence = lambda: None if lease["held"] else "no lease"
    op.add_input("in")
    op.push([1, 2], 0, "in")
    op.precommit(1, 0, durable=True)
    op.push([3], 1, "in")
    op.precommit(2, 1, durable=True)
    assert op.commit_ready(lambda ckpt: ckpt <= 1) == []
    lease["held"] = True
    assert op.commit_ready(lambda ckpt: True) == [1, 2]
    assert sorted(sink.read_committed()) == [1, 2, 3]
    assert op.commit_ready(lambda ckpt: True) == []
    assert sorted(sink.read_committed()) == [1, 2, 3]


def test_a_peer_refuses_a_connection_from_an_attempt_the_coordinator_took_for_lost(run):
    _, w, _ = run
    w.gen = 0
    w.fence_peer(1, 0)

    def dial(attempt: int) -> socket.socket:
        return channels.connect(
            tuple(w.address), SECRET, {"role": "data", "from": 1, "to": 0, "gen": 0, "attempt": attempt}
        )

    zombie = dial(0)
    fresh = dial(1)
    try:
        got: list = []
        deadline = time.monotonic() + DEADLINE_S
        while not got and time.monotonic() < deadline:
            got = w._accepted(0, wait=0.1)
        assert [(j, ident["attempt"]) for j, _, ident in got] == [(1, 1)]
        assert w.zombie_connections == 1
        # the zombie's connection was closed on it
        zombie.settimeout(DEADLINE_S)
        try:
            assert zombie.recv(1) == b""
        except ConnectionResetError:
            pass
    finally:
        for _, s, _ in got:
            s.close()
        zombie.close()
        fresh.close()

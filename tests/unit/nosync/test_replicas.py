"""Tests of the replicated level's protocol (`nosync.state.replicas`), between real parts.

Each worker is a stand-in with what `Replicas` reads of a worker (`index`, `attempt`, `out`:
peer -> connection); the connections are real `nosync.runtime.channels.Connection`s over
`socket.socketpair()`, one pair per direction, and `Cluster.deliver` is the event loop: it
flushes every sending end, `receive()`s every receiving end and hands each frame to the
receiver's `Replicas.on_frame`. The senders' stores are real `lsm.Store`s whose `on_logged`
feeds `Replicas.logged`. Expected values come from the test's own model (a dict of versions
per seq), never from the code under test; waits poll a condition with a deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

import lsm
import nosync.state.replicas as replicas_mod
from lsm import TOMBSTONE
from nosync.runtime import frames
from nosync.runtime.channels import Connection
from nosync.state.replicas import Replicas, holders_of

TIMEOUT_S = 10.0
"""Bound on every wait: each round of the protocol takes milliseconds."""
STORE = "nosync"
BIG = 1 << 30


class Worker:
    """What `Replicas` uses of a worker: its index, its attempt, and its sending connections."""

    def __init__(self, index: int, workers: int, replicas: int, budget: int, attempt: int = 0) -> None:
        self.index = index
        self.attempt = attempt
        self.out: dict[int, Connection] = {}
        self.inbound: dict[int, Connection] = {}
        """The receiving end of each peer's connection to this worker."""
        self.replicas = Replicas(index, workers, replicas, budget)


class Model:
    """The state after each seq: {state: {key: value}} (a dict of versions, by seq)."""

    def __init__(self) -> None:
        self.after: dict[int, dict] = {}
        self.now: dict = {}
        self.last = -1

    def append(self, seq: int, runs: dict) -> None:
        for state, kv in runs.items():
            cur = self.now.setdefault(state, {})
            for k, v in kv.items():
                if v is TOMBSTONE:
                    cur.pop(k, None)
                else:
                    cur[k] = v
        self.after[seq] = {state: dict(kv) for state, kv in self.now.items()}
        self.last = seq

    def state(self, state: object, as_of: int) -> dict:
        seqs = [q for q in self.after if q <= as_of]
        return dict(self.after[max(seqs)].get(state, {})) if seqs else {}


class Cluster:
    """W stand-in workers, connected both ways by real connections over socket pairs."""

    def __init__(self, workers: int, replicas: int, budget: int = BIG) -> None:
        self.n = workers
        self.r = replicas
        self.budget = budget
        self.workers = [Worker(i, workers, replicas, budget) for i in range(workers)]
        self.down: set[int] = set()
        """Holders whose link the senders see down (`up(j)` False)."""
        self.frames_seen: list[tuple[int, int, dict]] = []
        """(from, to, header) of every frame delivered."""
        for a in range(workers):
            for b in range(workers):
                if a != b:
                    self.link(a, b)

    def link(self, a: int, b: int) -> None:
        """A new connection from worker a to worker b (the old one, if any, closed)."""
        wa, wb = self.workers[a], self.workers[b]
        for old in (wa.out.get(b), wb.inbound.get(a)):
            if old is not None:
                old.close()
        s1, s2 = socket.socketpair()
        conn = Connection(s1, f"worker {b}")
        conn.attempt = wb.attempt  # as `connect_peer` marks it: the attempt it reaches
        wa.out[b] = conn
        wb.inbound[a] = Connection(s2, f"worker {a}")

    def restart(self, i: int, attempt: int | None = None) -> Worker:
        """Worker i's process is replaced: a fresh Replicas (no memory), new connections both
        ways; frames in flight to and from the old process are lost."""
        old = self.workers[i]
        w = Worker(i, self.n, self.r, self.budget, old.attempt + 1 if attempt is None else attempt)
        self.workers[i] = w
        for j in range(self.n):
            if j != i:
                self.link(i, j)
                self.link(j, i)
        for conn in (*old.out.values(), *old.inbound.values()):
            conn.close()
        return w

    def close(self) -> None:
        for w in self.workers:
            for conn in (*w.out.values(), *w.inbound.values()):
                conn.close()

    def up(self, j: int) -> bool:
        return j not in self.down

    def deliver(self, only: set[tuple[int, int]] | None = None) -> int:
        """Moves frames until none is left to move (on the links `only` names, if given): each
        frame goes to its receiver's `on_frame`. Returns the frames delivered."""
        moved_total = 0
        while True:
            moved = 0
            pending = False
            for a, wa in enumerate(self.workers):
                for b, conn in wa.out.items():
                    if only is not None and (a, b) not in only:
                        continue
                    if not conn.closed and not conn.flush():
                        pending = True
            for b, wb in enumerate(self.workers):
                for a, conn in wb.inbound.items():
                    if conn.closed or (only is not None and (a, b) not in only):
                        continue
                    for f in conn.receive():
                        assert f.kind == frames.REPLICA
                        self.frames_seen.append((a, b, dict(f.header)))
                        wb.replicas.on_frame(wb, a, f)
                        moved += 1
            moved_total += moved
            if not moved and not pending:
                return moved_total

    def poll(self, only: set[tuple[int, int]] | None = None) -> None:
        """One round of every worker's event loop: poll its replicas, then deliver."""
        for w in self.workers:
            w.replicas.poll(w, self.up)
        self.deliver(only)

    def until(self, condition: Callable[[], bool], what: str, only: set[tuple[int, int]] | None = None) -> None:
        """Runs rounds until `condition()` holds, or fails after TIMEOUT_S."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            self.poll(only)
            if condition():
                return
            assert time.monotonic() < deadline, f"no {what} after {TIMEOUT_S}s"
            time.sleep(0.001)


@pytest.fixture
def cluster() -> Iterator[Callable[..., Cluster]]:
    """Makes clusters; their connections are closed after the test."""
    made: list[Cluster] = []

    def make(workers: int, replicas: int, budget: int = BIG) -> Cluster:
        made.append(Cluster(workers, replicas, budget))
        return made[-1]

    yield make
    for c in made:
        c.close()


def open_store(tmp_path, name: str, replicas: Replicas, **options: object) -> lsm.Store:  # noqa: ANN001
    store = lsm.Store(str(tmp_path / name), on_logged=lambda recs: replicas.logged(STORE, recs), **options)
    replicas.add_store(STORE, store)
    return store


def batch(seq: int, width: int = 3, pad: int = 0) -> dict:
    """An append: keys overwritten and deleted, so that a base image stays small while the
    records after it grow; `pad` bytes of value per key make records big."""
    return {
        "counts": {f"k{(seq + i) % 7}": seq * 10 + i for i in range(width)} | {f"k{(seq + 3) % 7}": TOMBSTONE},
        ("meta", 1): {"seq": seq, "pad": "x" * pad},
    }


def append(store: lsm.Store, model: Model, seqs: list[int], **kw: int) -> None:
    for q in seqs:
        runs = batch(q, **kw)
        store.append(q, runs)
        model.append(q, runs)


def check_copy(tmp_path, name: str, img: lsm.Image, records: list, model: Model, upto: int) -> None:  # noqa: ANN001
    """Seeds a store from a copy; it holds the model's state as of `upto`, as of every seq from
    its horizon (and its image's seq) to `upto`."""
    path = str(tmp_path / name)
    last = lsm.seed(path, img, records)
    assert last == upto, f"the copy goes to seq {last}, expected {upto}"
    with lsm.Store(path) as s:
        assert s.last_seq == upto
        for as_of in range(max(s.horizon, img.seq, -1), upto + 1):
            for state in ("counts", ("meta", 1)):
                assert s.load(state, as_of=as_of) == model.state(state, as_of), f"{state!r} as of {as_of}"


def held(c: Cluster, holder: int, of: int) -> tuple[lsm.Image, list] | None:
    copy = c.workers[holder].replicas.held.get(of, {}).get(STORE)
    return None if copy is None else (copy.base, list(copy.records))


def copy_last(copy: tuple[lsm.Image, list]) -> int:
    """The last seq a copy holds."""
    img, records = copy
    return records[-1][0] if records else img.seq


def test_holders_of() -> None:
    assert holders_of(0, 3, 2) == [1, 2]
    assert holders_of(2, 3, 2) == [0, 1]
    assert holders_of(4, 5, 1) == [0]
    assert holders_of(1, 4, 3) == [2, 3, 0]


@pytest.mark.parametrize("chunk", [None, 40])
def test_base_then_puts_reach_the_holder_and_durable_follows_the_acks(tmp_path, monkeypatch, chunk, cluster) -> None:  # noqa: ANN001
    if chunk is not None:
        monkeypatch.setattr(replicas_mod, "CHUNK", chunk)
    c = cluster(2, 1)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        assert w0.replicas.durable(STORE) == -1
        append(store, model, [0, 1, 3])
        store.flush()
        c.until(lambda: w0.replicas.durable(STORE) == 3, "durable seq 3")
        base, _ = held(c, 1, 0)
        assert base.seq <= 3
        append(store, model, [4, 6, 7, 10])
        durables = []
        c.until(lambda: durables.append(w0.replicas.durable(STORE)) or durables[-1] == 10, "durable seq 10")
        assert durables == sorted(durables), f"durable went back: {durables}"
        assert all(d in (3, 4, 6, 7, 10) for d in durables), durables
        img, records = held(c, 1, 0)
        assert img.seq == base.seq, "a put replaced the base image"
        assert [q for q, _ in records] == [q for q in (0, 1, 3, 4, 6, 7, 10) if q > img.seq]
        check_copy(tmp_path, "from-holder", img, records, model, 10)
        m = w0.replicas.metrics()
        assert m["replica_base_images"] == 1
        assert m["replica_holders_over_budget"] == {}
        assert m["replica_holder_losses"] == 0
        assert m["replica_bytes_sent"] > 0
        ops = [h["op"] for a, b, h in c.frames_seen if (a, b) == (0, 1)]
        assert ops[0] == "base" and "put" in ops
        if chunk is not None:
            assert any(h.get("parts", 1) > 1 for _, _, h in c.frames_seen), "no message travelled in parts"
    finally:
        store.close()


def test_durable_is_the_least_over_the_holders(tmp_path, cluster) -> None:  # noqa: ANN001
    c = cluster(3, 2)
    w0 = c.workers[0]
    assert w0.replicas.holders == [1, 2]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 2])
        c.until(lambda: w0.replicas.durable(STORE) == 2, "durable seq 2")
        append(store, model, [5, 6])
        store.flush()
        # only holder 1's links move: holder 2 stays at seq 2
        only = {(0, 1), (1, 0)}
        c.until(lambda: w0.replicas.acked[1].get(STORE) == 6, "holder 1's ack of seq 6", only=only)
        assert w0.replicas.durable(STORE) == 2
        c.until(lambda: w0.replicas.durable(STORE) == 6, "durable seq 6")
        for j in (1, 2):
            img, records = held(c, j, 0)
            check_copy(tmp_path, f"from-{j}", img, records, model, 6)
    finally:
        store.close()


def test_a_holder_that_lost_its_memory_asks_for_a_base_and_gets_one(tmp_path, cluster) -> None:  # noqa: ANN001
    c = cluster(2, 1)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 1, 2])
        c.until(lambda: w0.replicas.durable(STORE) == 2, "durable seq 2")
        # worker 1's process restarts: its copies are gone; worker 0 never saw its link down
        c.restart(1)
        assert held(c, 1, 0) is None
        append(store, model, [4, 5])
        store.flush()
        c.until(lambda: w0.replicas.durable(STORE) == 5, "durable seq 5 after the holder's restart")
        answers = [h["op"] for a, b, h in c.frames_seen if (a, b) == (1, 0)]
        assert "need_base" in answers
        assert w0.replicas.metrics()["replica_base_images"] == 2
        img, records = held(c, 1, 0)
        assert img.seq >= 2, "the new base image holds what the lost copy held"
        check_copy(tmp_path, "rebased", img, records, model, 5)
        append(store, model, [9])
        c.until(lambda: w0.replicas.durable(STORE) == 9, "durable seq 9")
        img, records = held(c, 1, 0)
        check_copy(tmp_path, "rebased-then-put", img, records, model, 9)
    finally:
        store.close()


def test_a_holder_whose_link_went_down_gets_a_base_when_it_is_back(tmp_path, cluster) -> None:  # noqa: ANN001
    c = cluster(3, 2)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 1])
        c.until(lambda: w0.replicas.durable(STORE) == 1, "durable seq 1")
        c.down.add(2)
        c.poll()
        assert w0.replicas.holder_losses == 1
        append(store, model, [3, 4])
        store.flush()
        c.until(lambda: w0.replicas.acked[1].get(STORE) == 4, "holder 1's ack of seq 4")
        for _ in range(5):
            c.poll()
        assert w0.replicas.durable(STORE) == 1, "durable passed what the holder that is down holds"
        assert copy_last(held(c, 2, 0)) <= 1, "the holder that is down got records"
        c.down.discard(2)
        c.until(lambda: w0.replicas.durable(STORE) == 4, "durable seq 4 once the holder is back")
        m = w0.replicas.metrics()
        assert m["replica_holder_losses"] == 1
        assert m["replica_base_images"] == 3, "holders 1 and 2 based once, holder 2 again"
        img, records = held(c, 2, 0)
        check_copy(tmp_path, "back", img, records, model, 4)
    finally:
        store.close()


def test_a_holder_over_its_budget_with_records_answers_full_and_is_rebased(tmp_path, cluster) -> None:  # noqa: ANN001
    budget = 6000
    c = cluster(2, 1, budget=budget)
    w0 = c.workers[0]
    model = Model()
    # no versions kept: a merge leaves each key's newest, so the store's runs stay small
    store = open_store(tmp_path, "w0", w0.replicas, retention=0)
    try:
        append(store, model, [0])
        c.until(lambda: w0.replicas.durable(STORE) == 0, "durable seq 0")
        # records of ~800 bytes each, over keys overwritten: merged, the base image stays small
        seq = 0
        for _ in range(30):
            seq += 1
            append(store, model, [seq], pad=800)
            store.flush()
            store.compact()
            c.poll()
        c.until(lambda: w0.replicas.durable(STORE) == seq, f"durable seq {seq}")
        answers = [h["op"] for a, b, h in c.frames_seen if (a, b) == (1, 0)]
        assert "full" in answers
        assert w0.replicas.metrics()["replica_base_images"] >= 2
        assert w0.replicas.metrics()["replica_holders_over_budget"] == {}
        holder = c.workers[1].replicas
        assert holder.held_peak <= budget
        img, records = held(c, 1, 0)
        assert sum(len(b) for _, b in records) + sum(len(a) + len(b) for a, b in img.rows) <= budget
        check_copy(tmp_path, "after-full", img, records, model, seq)
    finally:
        store.close()


@pytest.mark.parametrize("grows", [False, True])
def test_a_budget_smaller_than_a_base_image_stops_the_holder(tmp_path, grows: bool, cluster) -> None:  # noqa: ANN001
    """The holder refuses the base image (at once, or once the store outgrew its budget);
    durable stops advancing and the metrics name the holder."""
    budget = 3000
    c = cluster(3, 2, budget=budget)
    # holder 2 has room; holder 1 does not
    c.workers[2].replicas.budget = BIG
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        if grows:
            append(store, model, [0])
            c.until(lambda: w0.replicas.durable(STORE) == 0, "durable seq 0")
        first = model.last
        # many distinct keys: the base image itself outgrows the budget
        for q in range(first + 1, first + 41):
            runs = {"counts": {f"wide{q}-{i}": "y" * 40 for i in range(5)}}
            store.append(q, runs)
            model.append(q, runs)
        store.flush()
        c.until(lambda: 1 in w0.replicas.metrics()["replica_holders_over_budget"], "holder 1 over its budget")
        assert w0.replicas.metrics()["replica_holders_over_budget"].keys() == {1}
        assert held(c, 1, 0) is None, "the holder kept a copy it had no room for"
        c.until(lambda: w0.replicas.acked[2].get(STORE) == model.last, "holder 2's ack")
        stuck = w0.replicas.durable(STORE)
        assert first <= stuck < model.last
        store.append(model.last + 1, {"counts": {"z": 1}})
        model.append(model.last + 1, {"counts": {"z": 1}})
        store.flush()
        c.until(lambda: w0.replicas.acked[2].get(STORE) == model.last, "holder 2's ack")
        for _ in range(5):
            c.poll()
        assert w0.replicas.durable(STORE) == stuck
        assert c.workers[1].replicas.held_peak <= budget
    finally:
        store.close()


@pytest.mark.parametrize("chunk", [None, 64])
def test_a_restarting_worker_fetches_the_copy_that_goes_furthest(tmp_path, monkeypatch, chunk, cluster) -> None:  # noqa: ANN001
    if chunk is not None:
        monkeypatch.setattr(replicas_mod, "CHUNK", chunk)
    c = cluster(3, 2)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas, merge_fanout=2, merge_min_bytes=0)
    try:
        append(store, model, [0, 1, 2, 4])
        c.until(lambda: w0.replicas.durable(STORE) == 4, "durable seq 4")
        append(store, model, [5, 8, 9])
        store.flush()
        # holder 2 goes no further than seq 4; holder 1 gets everything
        c.until(lambda: w0.replicas.acked[1].get(STORE) == 9, "holder 1's ack of seq 9", only={(0, 1), (1, 0)})
        assert copy_last(held(c, 2, 0)) == 4
        original = {state: store.load(state) for state in ("counts", ("meta", 1))}
    finally:
        store.abandon()
    # worker 0 loses its machine: a new process, attempt 1, asks its holders
    w = c.restart(0)
    pumps = []

    def pump(wait: float) -> None:
        pumps.append(wait)
        assert len(pumps) < 10_000, "the fetch never finished"
        c.deliver()

    best = w.replicas.fetch(w, pump)
    assert set(best) == {STORE}
    img, records = best[STORE]
    assert copy_last((img, records)) == 9, "fetch did not take the copy that goes furthest (holder 1's)"
    if chunk is not None:
        copies = [h for a, b, h in c.frames_seen if b == 0 and h.get("op") == "copy"]
        assert any(h["parts"] > 1 for h in copies), "no copy travelled in parts"
    path = str(tmp_path / "seeded")
    assert lsm.seed(path, img, records) == 9
    with lsm.Store(path) as s:
        assert s.last_seq == 9
        assert {state: s.load(state) for state in ("counts", ("meta", 1))} == original
        for as_of in range(max(s.horizon, img.seq), 10):
            for state in ("counts", ("meta", 1)):
                assert s.load(state, as_of=as_of) == model.state(state, as_of)


def test_a_holder_whose_copy_seeded_the_store_keeps_it_and_gets_only_what_follows(tmp_path, cluster) -> None:  # noqa: ANN001
    """After a lost machine, the holder whose copy ends where the seeded store does needs no
    base image: it goes on from its copy; one whose copy ends elsewhere gets a base."""
    c = cluster(3, 2)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 1, 2, 4])
        c.until(lambda: w0.replicas.durable(STORE) == 4, "durable seq 4")
        append(store, model, [5, 8])
        store.flush()
        # holder 2 goes no further than seq 4; holder 1 gets everything
        c.until(lambda: w0.replicas.acked[1].get(STORE) == 8, "holder 1's ack of seq 8", only={(0, 1), (1, 0)})
    finally:
        store.abandon()
    w = c.restart(0)
    best = w.replicas.fetch(w, lambda wait: c.deliver())
    path = tmp_path / "seeded"
    assert lsm.seed(str(path), *best[STORE]) == 8
    bases_before = [h for a, b, h in c.frames_seen if a == 0 and h.get("op") == "base"]
    store = open_store(path.parent, path.name, w.replicas)
    try:
        assert w.replicas.acked[1].get(STORE) == 8, "holder 1's copy, which the store was seeded from, counts"
        assert w.replicas.durable(STORE) == -1, "holder 2's copy ends at seq 4, not where the store does"
        append(store, model, [9, 11])
        store.flush()
        c.until(lambda: w.replicas.durable(STORE) == 11, "durable seq 11 at both holders")
        bases = [(b, h) for a, b, h in c.frames_seen if a == 0 and h.get("op") == "base"][len(bases_before) :]
        assert {b for b, _ in bases} == {2}, "holder 1 kept its copy; only holder 2 needed a base image"
        for holder in (1, 2):
            copy = held(c, holder, 0)
            assert copy_last(copy) == 11
            check_copy(tmp_path, f"check{holder}", *copy, model, upto=11)
    finally:
        store.close()


def test_a_fetch_is_answered_only_on_a_connection_to_the_attempt_that_asked(tmp_path, cluster) -> None:  # noqa: ANN001
    c = cluster(2, 1)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 3])
        c.until(lambda: w0.replicas.durable(STORE) == 3, "durable seq 3")
    finally:
        store.abandon()
    old_out = c.workers[1].out[0]
    w = c.restart(0)
    # the holder still sends on a connection to attempt 0 until it learns of attempt 1
    stale_sock, stale_peer = socket.socketpair()
    stale = Connection(stale_sock, "worker 0, attempt 0")
    stale.attempt = 0
    fresh = c.workers[1].out[0]
    c.workers[1].out[0] = stale
    assert old_out.closed
    calls = []

    def pump(wait: float) -> None:
        calls.append(wait)
        assert len(calls) < 10_000, "the fetch never finished"
        c.deliver()
        if len(calls) == 3:
            assert c.workers[1].replicas.asked == {0: 1}, "the holder answered a connection to another attempt"
            assert not stale._out, "the holder sent the copy to attempt 0"
            # PEER_BACK: the holder connects to attempt 1, and serves what it was asked
            c.workers[1].out[0] = fresh
            c.workers[1].replicas.serve(c.workers[1])

    best = w.replicas.fetch(w, pump)
    stale.close()
    stale_peer.close()
    assert copy_last(best[STORE]) == 3
    assert c.workers[1].replicas.asked == {}


def test_a_fetch_from_holders_with_no_copy_returns_nothing(cluster) -> None:  # noqa: ANN001
    c = cluster(3, 2)
    w = c.restart(0)
    best = w.replicas.fetch(w, lambda wait: c.deliver())
    assert best == {}


def test_a_message_cut_by_a_lost_link_leaves_no_part_behind(tmp_path, monkeypatch, cluster) -> None:  # noqa: ANN001
    """A base image in parts whose link dies after its first part arrived: the sender's next
    base (on a new connection, once the link is back) must reach the holder whole."""
    monkeypatch.setattr(replicas_mod, "CHUNK", 64)
    c = cluster(2, 1)
    w0 = c.workers[0]
    model = Model()
    store = open_store(tmp_path, "w0", w0.replicas)
    try:
        append(store, model, [0, 1, 2])
        store.flush()
        # the sender polls until its base image goes out (in parts); only the first part arrives
        deadline = time.monotonic() + TIMEOUT_S
        while not w0.out[1]._out:
            assert time.monotonic() < deadline, "no base image sent"
            w0.replicas.poll(w0, c.up)
        assert w0.out[1].flush()
        got = []
        while not got:
            assert time.monotonic() < deadline, "no frame arrived"
            got = c.workers[1].inbound[0].receive()
        assert got[0].header["op"] == "base" and got[0].header["parts"] > 1
        c.workers[1].replicas.on_frame(c.workers[1], 0, got[0])
        # the link dies: the rest of the message is lost; the sender sees it down, then back
        c.link(0, 1)
        c.link(1, 0)
        c.down.add(1)
        w0.replicas.poll(w0, c.up)
        assert w0.replicas.holder_losses == 1
        c.down.discard(1)
        c.until(lambda: w0.replicas.durable(STORE) == 2, "durable seq 2 after the link came back")
        img, records = held(c, 1, 0)
        check_copy(tmp_path, "after-cut", img, records, model, 2)
    finally:
        store.close()

"""Authenticated channels and credit-based flow control, on real sockets on 127.0.0.1; and the
coordinator refusing a connection that does not know the run's secret, and writing how many
records the run has read to its events."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from nosync.driver.coordinator import Coordinator
from nosync.errors import AuthError
from nosync.modes import get_mode
from nosync.runtime import channels, frames

SECRET = b"the run's secret"
DEADLINE_S = 10.0


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    """Polls `cond` until it holds; fails with `what` at the deadline."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


class Server:
    """Accepts one connection on a thread and runs `handler(sock)` on it; keeps the result or
    the exception."""

    def __init__(self, handler: Callable[[socket.socket], object]) -> None:
        self.listener = channels.listen("127.0.0.1", 0)
        self.address = self.listener.getsockname()
        self.result: object = None
        self.error: BaseException | None = None
        self._handler = handler
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock, _ = self.listener.accept()
        try:
            self.result = self._handler(sock)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e
        finally:
            sock.close()

    def join(self) -> None:
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), "server thread did not finish"
        self.listener.close()


# -- the handshake ---------------------------------------------------------------------------


def test_handshake_with_the_right_secret_delivers_the_identity():
    ident = {"role": "data", "from": 2, "to": 0, "note": "é"}
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    sock = channels.connect(server.address, SECRET, ident)
    try:
        server.join()
        assert server.error is None
        assert server.result == ident
        assert sock.gettimeout() is None  # blocking again after the handshake
    finally:
        sock.close()


def test_both_ends_of_a_handshake_send_small_frames_at_once():
    """Nagle's algorithm off on both sides (TCP_NODELAY): the coordinator's broadcasts and a
    worker's frames each go out when written, not after the acknowledgement of the one
    before."""

    def accept(s: socket.socket) -> int:
        channels.accept_handshake(s, SECRET)
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    server = Server(accept)
    sock = channels.connect(server.address, SECRET, {"role": "worker"})
    try:
        server.join()
        assert server.error is None
        assert server.result != 0
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()


def test_client_with_a_wrong_secret_is_refused_on_both_sides():
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    with pytest.raises(AuthError):
        channels.connect(server.address, b"not the secret", {"role": "worker"})
    server.join()
    assert isinstance(server.error, AuthError)
    assert "MAC mismatch" in str(server.error)


def impostor(secret: bytes) -> Callable[[socket.socket], object]:
    """A server that follows the protocol but proves `secret` instead of the run's."""

    def handler(sock: socket.socket) -> object:
        server_nonce = os.urandom(channels.NONCE)
        sock.sendall(channels.HELLO + server_nonce)
        f = sock.makefile("rb")
        (n,) = struct.unpack("<H", f.read(2))
        f.read(n)
        client_nonce = f.read(channels.NONCE)
        f.read(channels.MAC)
        sock.sendall(hmac.new(secret, b"s" + client_nonce + server_nonce, hashlib.sha256).digest())
        return sock.recv(1)  # b"": the client hung up on us

    return handler


def test_server_with_a_wrong_secret_is_detected_by_the_client():
    server = Server(impostor(b"a guess"))
    with pytest.raises(AuthError, match="server failed to prove"):
        channels.connect(server.address, SECRET, {"role": "worker"})
    server.join()
    assert server.error is None
    assert server.result == b""


def test_impostor_that_knows_the_secret_is_accepted():
    """Control for the test above: the same fake server with the right secret passes, so it is
    the secret, not the fake, that the client rejected."""
    server = Server(impostor(SECRET))
    sock = channels.connect(server.address, SECRET, {"role": "worker"})
    sock.close()
    server.join()
    assert server.error is None


def test_peer_that_is_not_a_nosync_endpoint():
    server = Server(lambda s: s.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 64))
    with pytest.raises(AuthError, match="not a nosync endpoint"):
        channels.connect(server.address, SECRET, {"role": "worker"})
    server.join()


def test_client_that_hangs_up_mid_handshake():
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    sock = socket.create_connection(server.address)
    assert len(sock.recv(len(channels.HELLO) + channels.NONCE, socket.MSG_WAITALL)) == 36
    sock.sendall(struct.pack("<H", 5) + b"ab")
    sock.close()
    server.join()
    assert isinstance(server.error, AuthError)
    assert "closed during the handshake" in str(server.error)


# -- credit flow -----------------------------------------------------------------------------


def connected_pair() -> tuple[socket.socket, socket.socket]:
    listener = channels.listen("127.0.0.1", 0)
    try:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    finally:
        listener.close()
    return a, b


def read_until(sock: socket.socket, reader: frames.FrameReader, sentinel: str) -> list[frames.Frame]:
    """Frames received up to and including the CONTROL frame whose body is `sentinel`."""
    sock.settimeout(DEADLINE_S)
    got: list[frames.Frame] = []
    while not got or got[-1].body != sentinel:
        data = sock.recv(1 << 16)
        assert data, "connection closed"
        got.extend(reader.feed(data))
    return got


def flush_all(conn: channels.Connection) -> None:
    wait_until(conn.flush, "the socket to take the queued frames")


def test_credits_bound_the_frames_queued_for_the_socket():
    a, b = connected_pair()
    conn = channels.Connection(a, "peer", credits=2)
    data = [frames.encode(frames.DATA, {"edge": 0, "epoch": 0}, [i]) for i in range(5)]
    try:
        for d in data:
            conn.send(d)
        assert conn.credits == 0
        assert conn.backlog == 5
        # a frame that needs no credit overtakes the waiting ones: it marks what reached the socket
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-1"))
        flush_all(conn)
        assert conn.backlog == 3  # still waiting for credit
        reader = frames.FrameReader()
        got = read_until(b, reader, "mark-1")
        assert [f.body for f in got] == [(0,), (1,), "mark-1"]

        conn.grant(1)
        assert conn.credits == 0
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-2"))
        flush_all(conn)
        assert [f.body for f in read_until(b, reader, "mark-2")] == [(2,), "mark-2"]
        assert conn.backlog == 2

        conn.grant(5)
        assert conn.credits == 3
        last = frames.encode(frames.DATA, {"edge": 0, "epoch": 1}, [5])
        conn.send(last)  # uses a credit at once
        assert conn.credits == 2
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-3"))
        flush_all(conn)
        assert [f.body for f in read_until(b, reader, "mark-3")] == [(3,), (4,), (5,), "mark-3"]
        assert conn.backlog == 0
        marks = sum(len(frames.encode(frames.CONTROL, {}, m)) for m in ("mark-1", "mark-2", "mark-3"))
        assert conn.bytes_sent == sum(map(len, data)) + len(last) + marks
    finally:
        conn.close()
        b.close()


def test_frames_wait_behind_earlier_waiting_frames_even_with_credit():
    """FIFO: once a frame waits for credit, later frames queue behind it."""
    a, b = connected_pair()
    conn = channels.Connection(a, "peer", credits=1)
    try:
        conn.send(frames.encode(frames.DATA, {}, "first"))
        conn.send(frames.encode(frames.DATA, {}, "second"))
        conn.credits += 1  # a credit appears without grant() moving the queue
        conn.send(frames.encode(frames.DATA, {}, "third"))
        conn.grant(0)
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark"))
        flush_all(conn)
        got = [f.body for f in read_until(b, frames.FrameReader(), "mark")]
        assert got == ["first", "second", "mark"]
    finally:
        conn.close()
        b.close()


def test_receive_returns_frames_and_reports_the_peer_closing():
    a, b = connected_pair()
    receiver = channels.Connection(b, "sender")
    try:
        blobs = [frames.encode(frames.DATA, {"i": i}, list(range(i))) for i in range(4)]
        a.sendall(b"".join(blobs))
        got: list[frames.Frame] = []
        wait_until(lambda: got.extend(receiver.receive()) or len(got) == 4, "four frames")
        assert [f.header["i"] for f in got] == [0, 1, 2, 3]
        assert receiver.bytes_received == sum(map(len, blobs))
        a.close()

        def closed() -> bool:
            try:
                assert receiver.receive() == []
            except ConnectionError:
                return True
            return False

        wait_until(closed, "ConnectionError after the peer closed")
    finally:
        receiver.close()


# -- the coordinator refuses strangers -------------------------------------------------------


def worker_identity(run_id: str, worker: int = 0) -> dict:
    return {"role": "worker", "worker": worker, "attempt": 0, "run": run_id}


@pytest.fixture
def coordinator():
    c = Coordinator(1, SECRET, get_mode("none"), "run-1")
    yield c
    c.close()


def test_coordinator_refuses_a_wrong_secret_and_closes_the_connection(coordinator):
    sock = socket.create_connection(coordinator.address)
    try:
        with pytest.raises(AuthError):
            channels.connect_handshake(sock, b"wrong secret", worker_identity("run-1"))
        wait_until(lambda: coordinator.refused == 1, "coordinator.refused == 1")
        sock.settimeout(DEADLINE_S)
        try:
            assert sock.recv(1) == b""  # closed by the coordinator
        except ConnectionResetError:
            pass
    finally:
        sock.close()
    assert coordinator.conns == {}
    assert coordinator.refused == 1


def test_coordinator_refuses_the_right_secret_for_another_run(coordinator):
    # the MACs check out, so the handshake completes; then the identity is refused
    sock = channels.connect(coordinator.address, SECRET, worker_identity("run-2"))
    try:
        sock.settimeout(DEADLINE_S)
        assert sock.recv(1) == b""  # the coordinator hung up
    finally:
        sock.close()
    wait_until(lambda: coordinator.refused == 1, "coordinator.refused == 1")
    assert coordinator.conns == {}


def test_coordinator_registers_a_worker_with_the_right_secret(coordinator):
    with pytest.raises(AuthError):
        channels.connect(coordinator.address, b"wrong", worker_identity("run-1"))
    wait_until(lambda: coordinator.refused == 1, "the refusal")

    sock = channels.connect(coordinator.address, SECRET, worker_identity("run-1"))
    try:
        sock.sendall(
            frames.encode(
                frames.CONTROL,
                {},
                {"type": "register", "worker": 0, "attempt": 0, "addr": ["127.0.0.1", 4242]},
            )
        )
        sock.settimeout(DEADLINE_S)
        reader = frames.FrameReader()
        got: list[frames.Frame] = []
        while not got:
            data = sock.recv(1 << 16)
            assert data, "the coordinator closed a registered worker's connection"
            got.extend(reader.feed(data))
        assert got[0].kind == frames.CONTROL
        body = dict(got[0].body)
        # the run's source clock starts with its first generation (`SourceClock`)
        assert abs(body.pop("source_t0") - time.time()) < 60
        assert body == {"type": "peers", "gen": 0, "addresses": (("127.0.0.1", 4242),), "moved": {}}
        assert 0 in coordinator.conns
        assert coordinator.attempts == {0: 0}
        assert coordinator.refused == 1
        assert coordinator.failure is None
    finally:
        sock.close()


# -- the coordinator's progress events ---------------------------------------------------------


def test_coordinator_writes_the_records_read_as_progress_events_when_they_change(tmp_path):
    """The sum of the workers' last counts of records read goes to events.jsonl, at most every
    PROGRESS_EVENT_S and only when it changed; it may go down (a worker restored)."""
    from nosync.driver.coordinator import PROGRESS_EVENT_S

    c = Coordinator(2, SECRET, get_mode("none"), "run-1", run_dir=str(tmp_path))

    def reads() -> list[int]:
        return [e["read"] for e in c.events if e["event"] == "progress"]

    try:
        with c._lock:
            c.counters = {0: {"read": 5}, 1: {"read": 7}}
        wait_until(lambda: reads() == [12], "a progress event of 12 records")
        time.sleep(3 * PROGRESS_EVENT_S)
        assert reads() == [12], "a progress event without a change"
        with c._lock:
            c.counters = {0: {"read": 2}, 1: {"read": 7}}
        wait_until(lambda: reads() == [12, 9], "a progress event of 9 records")
        times = [e["t"] for e in c.events if e["event"] == "progress"]
        assert times[1] - times[0] >= PROGRESS_EVENT_S
    finally:
        c.close()
    with open(tmp_path / "events.jsonl", encoding="utf-8") as f:
        assert [e["read"] for e in map(json.loads, f) if e["event"] == "progress"] == [12, 9]


# -- handshakes off the loop: the acceptor -----------------------------------------------------


def test_a_handshake_that_dribbles_is_cut_at_its_overall_deadline(monkeypatch):
    """A client that sends a byte every 0.2 s never leaves a single recv waiting as long as
    the deadline; the handshake as a whole is cut when the deadline passes."""
    monkeypatch.setattr(channels, "HANDSHAKE_TIMEOUT_S", 0.6)
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    sock = socket.create_connection(server.address)
    stop = threading.Event()

    def dribble() -> None:
        sock.recv(len(channels.HELLO) + channels.NONCE, socket.MSG_WAITALL)
        sock.sendall(struct.pack("<H", 200))
        while not stop.wait(0.2):  # 200 bytes of identity at this pace: 40 s
            try:
                sock.sendall(b"x")
            except OSError:
                return

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    try:
        server.join()
    finally:
        stop.set()
        t.join(DEADLINE_S)
        sock.close()
    assert isinstance(server.error, AuthError)
    assert "not done within" in str(server.error)


class Listening:
    """An Acceptor on a fresh loopback listener, closed by `close`."""

    def __init__(self) -> None:
        listener = channels.listen("127.0.0.1", 0)
        self.address = listener.getsockname()
        self.acceptor = channels.Acceptor(listener, SECRET, "test")

    def take_one(self) -> tuple:
        got = self.acceptor.take(DEADLINE_S)
        assert got, "no connection passed the handshake"
        return got[0]

    def close(self) -> None:
        self.acceptor.close()


def test_silent_strangers_do_not_hold_back_a_peer_that_speaks():
    srv = Listening()
    strangers = [socket.create_connection(srv.address) for _ in range(5)]
    peer = None
    try:
        peer = channels.connect(srv.address, SECRET, {"role": "data", "from": 1})
        sock, _, ident = srv.take_one()
        sock.close()
        assert ident == {"role": "data", "from": 1}
        assert srv.acceptor.refused == 0  # the strangers are still within their deadline
    finally:
        for s in strangers:
            s.close()
        if peer is not None:
            peer.close()
        srv.close()


def test_connections_past_the_cap_of_pending_handshakes_are_closed_at_once(monkeypatch):
    monkeypatch.setattr(channels, "MAX_PENDING_HANDSHAKES", 2)
    srv = Listening()
    strangers = []
    try:
        for _ in range(5):
            strangers.append(socket.create_connection(srv.address))
        wait_until(lambda: srv.acceptor.refused == 3, "three refusals")
        greeted, closed = 0, 0
        for s in strangers:
            s.settimeout(DEADLINE_S)
            first = s.recv(len(channels.HELLO) + channels.NONCE, socket.MSG_WAITALL)
            if first == b"":
                closed += 1
            else:
                assert first.startswith(channels.HELLO)
                greeted += 1
        assert (greeted, closed) == (2, 3)
        # once the pending ones end, a peer gets a slot again
        for s in strangers:
            s.close()
        wait_until(lambda: srv.acceptor.refused == 5, "the two pending handshakes to end")
        peer = channels.connect(srv.address, SECRET, {"role": "data", "from": 2})
        sock, _, ident = srv.take_one()
        sock.close()
        peer.close()
        assert ident["from"] == 2
    finally:
        for s in strangers:
            s.close()
        srv.close()


# -- the coordinator suspects a silent worker --------------------------------------------------


def test_the_coordinator_suspects_a_silent_worker_tells_it_and_has_its_task_killed(tmp_path):
    killed: list[tuple[int, str]] = []
    c = Coordinator(
        1,
        SECRET,
        get_mode("none"),
        "run-1",
        run_dir=str(tmp_path),
        failure_timeout_s=0.5,
        kill_task=lambda task, pid, reason: killed.append((task, reason)),
    )
    sock = channels.connect(c.address, SECRET, worker_identity("run-1"))
    try:
        register = {"type": "register", "worker": 0, "attempt": 0, "addr": ["127.0.0.1", 4242], "task": 77}
        sock.sendall(frames.encode(frames.CONTROL, {}, register))
        # beating for three timeouts: never suspected
        for _ in range(15):
            sock.sendall(frames.encode(frames.CONTROL, {}, {"type": "heartbeat", "gen": 0, "read": 1}))
            time.sleep(0.1)
        assert c.suspicions == [] and c.failure is None
        # then silent, as a stopped process is
        wait_until(lambda: killed, "the kill of the silent worker's task")
        assert killed[0][0] == 77 and "worker 0" in killed[0][1]
        assert c.failure is not None and "worker 0" in c.failure and "no heartbeat" in c.failure
        sock.settimeout(DEADLINE_S)
        reader = frames.FrameReader()
        got: list[frames.Frame] = []
        while "replaced" not in [f.body.get("type") for f in got]:
            data = sock.recv(1 << 16)
            assert data, f"the connection ended before the zombie was told: {got}"
            got.extend(reader.feed(data))
        kinds = [f.body.get("type") for f in got]
        # what a zombie reads when it wakes: it was replaced (its connection stays open for its
        # report, `test_fencing`)
        assert kinds.index("replaced") > kinds.index("peers")
        assert c.fencing()["zombies"] == 1
    finally:
        sock.close()
        c.close()
    with open(tmp_path / "events.jsonl", encoding="utf-8") as f:
        kinds = [json.loads(line)["event"] for line in f]
    assert kinds.index("suspected") < kinds.index("worker_lost") < kinds.index("failed")


# -- standbys ----------------------------------------------------------------------------------


class FakeWorkerConn:
    """A process's control connection to the coordinator, driven by hand: register, beat on a
    thread, read what the coordinator says."""

    def __init__(self, c: Coordinator, index: int, attempt: int = 0) -> None:
        self.sock = channels.connect(c.address, SECRET, worker_identity(c.run_id, index))
        self.sock.settimeout(DEADLINE_S)
        self.reader = frames.FrameReader()
        self.got: list[dict] = []
        self.beating = threading.Event()
        self.index = index
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def send(self, msg: dict) -> None:
        with self.lock:
            self.sock.sendall(frames.encode(frames.CONTROL, {}, msg))

    def register(self, worker: int, attempt: int, task: int, host: str = "127.0.0.1") -> None:
        addr = [host, 4000 + worker]
        self.send({"type": "register", "worker": worker, "attempt": attempt, "addr": addr, "task": task})
        self.beating.set()

    def _beat(self) -> None:
        while True:
            time.sleep(0.05)
            if self.beating.is_set():
                try:
                    self.send({"type": "heartbeat", "gen": 0, "read": 1})
                except OSError:
                    return

    def wait_for(self, kind: str) -> dict:
        while True:
            for m in self.got:
                if m.get("type") == kind:
                    return m
            data = self.sock.recv(1 << 16)
            assert data, f"the coordinator closed the connection before a {kind} message: {self.got}"
            self.got.extend(f.body for f in self.reader.feed(data))

    def close(self) -> None:
        self.beating.clear()
        self.sock.close()


def with_a_standby(tmp_path, failure_timeout_s: float, kill_task) -> tuple:
    """A coordinator of an abs run at W = 2 with one standby, and the processes of workers 0
    and 1 (tasks 10, 11) and of the standby (task index W, task 12), registered."""
    from nosync.options import RunOptions

    c = Coordinator(
        2,
        SECRET,
        get_mode("abs", RunOptions(mode="abs", run_dir=str(tmp_path))),
        "run-1",
        run_dir=str(tmp_path),
        failure_timeout_s=failure_timeout_s,
        kill_task=kill_task,
        standbys=1,
    )
    w0, w1, spare = (FakeWorkerConn(c, i) for i in (0, 1, 2))
    w0.register(0, 0, task=10)
    w1.register(1, 0, task=11)
    spare.register(2, 0, task=12)
    return c, w0, w1, spare


def test_a_suspected_worker_is_replaced_by_a_standby_and_its_retry_stands_by(tmp_path):
    killed: list[int] = []
    c, w0, w1, spare = with_a_standby(tmp_path, 0.5, lambda task, pid, reason: killed.append(task))
    procs = [w0, w1, spare]
    try:
        assert spare.wait_for("standby") == {"type": "standby"}
        w0.wait_for("peers")
        # worker 1 hangs: silent, its connection open
        w1.beating.clear()
        promote = spare.wait_for("promote")
        assert (promote["worker"], promote["attempt"]) == (1, 1)
        assert killed == [11]
        spare.register(1, 1, task=12)
        wait_until(lambda: c.attempts.get(1) == 1, "the promoted standby registered as worker 1, attempt 1")
        # Spark's retry of worker 1's killed task: worker 1 is taken, so it stands by
        retry = FakeWorkerConn(c, 1)
        procs.append(retry)
        retry.register(1, 1, task=13)
        assert retry.wait_for("standby") == {"type": "standby"}
        assert c.attempts == {0: 0, 1: 1} and c.failure is None, c.failure
        assert [s["task"] for s in c.standbys.values()] == [13]
        events = list(c.events)
    finally:
        c.close()
        for p in procs:
            p.close()
    kinds = [e["event"] for e in events]
    assert kinds.index("suspected") < kinds.index("promoted")
    assert [e["worker"] for e in events if e["event"] == "promoted"] == [1]


def test_a_retry_whose_attempt_a_promotion_used_is_given_the_next(tmp_path):
    """A standby was promoted to worker 1 as attempt 1 and then lost too; Spark's retry of
    worker 1's first task comes with Spark's attempt 1: it is renumbered, 2."""
    c, w0, w1, spare = with_a_standby(tmp_path, 5.0, lambda task, pid, reason: None)
    procs = [w0, w1, spare]
    try:
        spare.wait_for("standby")
        w1.close()  # its process died: the connection drops
        assert spare.wait_for("promote")["attempt"] == 1
        spare.register(1, 1, task=12)
        wait_until(lambda: c.attempts.get(1) == 1, "the promoted standby registered")
        spare.close()  # lost as well, and no standby is left
        wait_until(lambda: 1 not in c.conns, "the loss of the promoted standby")
        retry = FakeWorkerConn(c, 1)
        procs.append(retry)
        retry.register(1, 1, task=13)
        assert retry.wait_for("promote") == {"type": "promote", "worker": 1, "attempt": 2}
        retry.register(1, 2, task=13)
        wait_until(lambda: c.attempts.get(1) == 2, "the retry registered as attempt 2")
        assert c.failure is None, c.failure
    finally:
        c.close()
        for p in procs:
            p.close()


def test_workers_lost_and_never_placed_again_fail_the_run_naming_them(tmp_path, monkeypatch):
    """The standby replaces worker 1; then worker 0 and the promoted standby are lost too, and
    neither a standby nor a retry comes: the run fails naming both, not the one placed."""
    from nosync.driver import standbys

    monkeypatch.setattr(standbys, "PLACE_TIMEOUT_S", 0.5)
    c, w0, w1, spare = with_a_standby(tmp_path, 5.0, lambda task, pid, reason: None)
    procs = [w0, w1, spare]
    try:
        spare.wait_for("standby")
        w1.close()
        assert spare.wait_for("promote")["attempt"] == 1
        spare.register(1, 1, task=12)
        wait_until(lambda: c.attempts.get(1) == 1, "the promoted standby registered")
        assert c.failure is None
        w0.close()
        spare.close()
        wait_until(lambda: c.failure is not None, "the run to fail")
        assert "workers 0, 1 lost and not placed again within 0.5 s" in c.failure, c.failure
        assert "--standbys" in c.failure
    finally:
        c.close()
        for p in procs:
            p.close()


def test_an_attempt_on_another_host_than_the_last_ones_is_told_its_local_stores_are_stale(tmp_path):
    """Worker 0's attempts run on hosts A, then B, then B again: the generation that takes
    attempt 1 names it moved (what B holds of worker 0 is older than what A made durable);
    attempt 2 runs where attempt 1 did, and is not."""
    from nosync.options import RunOptions

    c = Coordinator(
        2,
        SECRET,
        get_mode("abs", RunOptions(mode="abs", run_dir=str(tmp_path))),
        "run-1",
        run_dir=str(tmp_path),
        failure_timeout_s=5.0,
    )
    w0, w1 = FakeWorkerConn(c, 0), FakeWorkerConn(c, 1)
    procs = [w0, w1]
    try:
        w0.register(0, 0, task=10, host="10.9.0.1")
        w1.register(1, 0, task=11, host="10.9.0.2")
        assert w1.wait_for("peers")["moved"] == {}
        for attempt, host, moved in ((1, "10.9.0.3", {0: 1}), (2, "10.9.0.3", {})):
            procs[0].close()  # its process died: the connection drops
            wait_until(lambda a=attempt: c.gen >= a, f"the regroup after attempt {attempt - 1}'s loss")
            retry = FakeWorkerConn(c, 0)
            procs[0] = retry
            retry.register(0, attempt, task=10 + attempt, host=host)
            w1.got = []
            rejoin = w1.wait_for("rejoin")["gen"]
            w1.send({"type": "register", "worker": 1, "attempt": 0, "addr": ["10.9.0.2", 4001], "gen": rejoin})
            peers = retry.wait_for("peers")
            assert peers["gen"] == rejoin and peers["moved"] == moved, peers
    finally:
        c.close()
        for p in procs:
            p.close()
